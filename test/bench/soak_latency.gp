# Claim latency per period (new keys: p50, p99; every script: p99), from soak.dat; load average right.
# gnuplot -e "out='soak_latency.png'" soak_latency.gp
set terminal pngcairo size 1000,420 font ",10" noenhanced
set output out
set title "latency per minute (service time, pgbench's schedule lag left out)"
set xlabel "minute"
set ylabel "µs"
set y2label "load average"
set logscale y
set y2range [0:*]
set ytics nomirror
set y2tics
set key top left
set grid
plot "soak.dat" using 1:3 with lines lw 2 title "new-key claim p50", \
     "soak.dat" using 1:4 with lines lw 2 title "new-key claim p99", \
     "soak.dat" using 1:5 with lines lw 1 title "all scripts p99", \
     "soak.dat" using 1:27 axes x1y2 with lines lw 1 dt 2 lc rgb "gray40" title "load average"
