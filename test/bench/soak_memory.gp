# Memory of the sweeper and the launcher per sample (kB), from soak.dat.
# gnuplot -e "out='soak_memory.png'" soak_memory.gp
set terminal pngcairo size 1000,420 font ",10" noenhanced
set output out
set multiplot layout 1,2 title "idempo workers' memory (kB): RssAnon (own heap), private dirty, PSS, RSS"
set xlabel "minute"
set ylabel "kB"
set yrange [0:*]
set key bottom right
set grid
set title "sweeper"
plot "soak.dat" using 1:24 with lines lw 2 title "RssAnon", "soak.dat" using 1:26 with lines lw 1 title "private dirty", \
     "soak.dat" using 1:25 with lines lw 1 title "PSS", "soak.dat" using 1:23 with lines lw 1 title "RSS"
set title "launcher"
plot "soak.dat" using 1:20 with lines lw 2 title "RssAnon", "soak.dat" using 1:22 with lines lw 1 title "private dirty", \
     "soak.dat" using 1:21 with lines lw 1 title "PSS", "soak.dat" using 1:19 with lines lw 1 title "RSS"
unset multiplot
