# Claim latency against stored operations, from the scale.dat that report.py writes.
# gnuplot -e "data='scale.dat'; out='claim_latency.png'" plot.gp
set terminal pngcairo size 800,480 font ",10"
set output out
set title "idempo: claim latency against stored operations (1 client, pinned, sync commit off)"
set logscale x 10
set format x "10^{%L}"
set xlabel "operations stored"
set ylabel "latency per claim (µs)"
set yrange [0:*]
set key top left
set grid
plot data using 1:2 with linespoints lw 2 pt 7 title "average", \
     data using 1:3 with linespoints lw 2 pt 5 title "p99"
