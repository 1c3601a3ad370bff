# Size of idempo.operations (heap, indexes, the sweep_at index) per period, from soak.dat (soak_report.py); load average on the right.
# gnuplot -e "out='soak_size.png'" soak_size.gp
set terminal pngcairo size 1000,420 font ",10" noenhanced
set output out
set title "idempo.operations under a soak: size and dead tuples (retention 1 minute)"
set xlabel "minute"
set ylabel "MB"
set y2label "rows, dead tuples (thousands); load average x 10"
set yrange [0:*]
set y2range [0:*]
set ytics nomirror
set y2tics
set key top left
set grid
plot "soak.dat" using 1:8 with lines lw 2 title columnheader(8), \
     "soak.dat" using 1:9 with lines lw 2 title columnheader(9), \
     "soak.dat" using 1:12 with lines lw 1 title "of which sweep_at index", \
     "soak.dat" using 1:($10 / 1000) axes x1y2 with lines lw 1 title "dead tuples (thousands)", \
     "soak.dat" using 1:($28 / 1000) axes x1y2 with lines lw 1 title "rows (thousands)", \
     "soak.dat" using 1:($27 * 10) axes x1y2 with lines lw 1 dt 2 lc rgb "gray40" title "load average x 10"
