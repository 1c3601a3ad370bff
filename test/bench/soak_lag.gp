# Sweeper lag (age of the oldest due row) at each sample, from soak.dat; load average on the right.
# gnuplot -e "out='soak_lag.png'" soak_lag.gp
set terminal pngcairo size 1000,420 font ",10" noenhanced
set output out
set title "sweeper lag: age of the oldest due row of idempo.operations (sweep_interval 10 s)"
set xlabel "minute"
set ylabel "seconds"
set y2label "load average"
set yrange [0:*]
set y2range [0:*]
set ytics nomirror
set y2tics
set key top left
set grid
plot "soak.dat" using 1:14 with linespoints lw 2 title "lag (s)", \
     20 with lines dt 3 lc rgb "red" title "target: 2 x sweep_interval", \
     "soak.dat" using 1:27 axes x1y2 with lines lw 1 dt 2 lc rgb "gray40" title "load average"
