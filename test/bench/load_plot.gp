# Throughput against clients, from the clients.dat that load_report.py writes (median TPS per
# variant; columns 2-6 with synchronous_commit off, 7-11 with it on).
# gnuplot -e "data='clients.dat'; out='throughput_clients.png'" load_plot.gp
set terminal pngcairo size 1000,420 font ",10" noenhanced
set output out
set multiplot layout 1,2 title "idempo under load: throughput against clients (median of rounds, interleaved)"
set logscale x 2
set xlabel "clients"
set ylabel "transactions/s"
set yrange [0:*]
set key top left
set grid
set title "synchronous_commit off"
plot for [i=2:6] data using 1:i with linespoints lw 2 title columnheader(i)
set title "synchronous_commit on (fsync on)"
plot for [i=7:11] data using 1:i with linespoints lw 2 title columnheader(i)
unset multiplot
