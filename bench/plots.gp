# bench/plots.gp — the figures of bench/results.json as PNGs in bench/plots/.
# bench/report.py runs it with gnuplot -e "data=DIR; plots=DIR; machine=TEXT; ..." after
# writing the data files under DIR; the lists it sets name what there is to draw:
#   cells              the providers that ran (cells_<provider>_<language>.dat)
#   serve_load         conversations of each run (serve_load_cdf_<n>.dat)
#   turns_per_second   conversations of each run (turns_per_second_cdf_<n>.dat)
#   idle_memory        (set when idle_memory_scale.dat is there)
#   turns_held         the store engines measured (turns_held_<engine>.dat)

set terminal pngcairo size 1000,640 enhanced font "DejaVu Sans,11" linewidth 1.5
set grid xtics ytics mxtics mytics lc rgb "#dddddd"
set key top left box opaque
set style data linespoints
set pointsize 0.8
footer = "measured on ".machine
langs = "python javascript"

# ------------------------------------------------------------------ cells
if (exists("cells")) {
    set output plots."/cells_warm_cdf.png"
    set title "Warm trivial cell (code: 1) end to end through the verified client, one session\n{/*0.8 ".footer."}"
    set xlabel "latency per cell (ms, log scale)"
    set ylabel "fraction of cells at or below (CDF)"
    set logscale x
    set yrange [0:1]
    set key bottom right
    plot for [i=1:words(cells)] for [j=1:2] \
        data."/cells_".word(cells,i)."_".word(langs,j).".dat" using 1:2 with lines \
        lc i dt j title word(cells,i)." ".word(langs,j)
    unset logscale x
    set yrange [*:*]

    set output plots."/cells_open.png"
    set title "Open a session + first trivial cell: cold (no pool) vs from the warm pool, p50 of 5\n{/*0.8 ".footer."}"
    set xlabel "provider and language"
    set ylabel "open + first cell (ms, log scale)"
    set logscale y
    set yrange [0.1:*]
    set style data histogram
    set style histogram clustered gap 1
    set style fill solid 0.8 border -1
    set boxwidth 0.9
    set xtics rotate by -30 left
    set key top right
    plot data."/cells_open.dat" using 2:xtic(1) title "cold (sandbox and interpreter start)", \
         "" using 3 title "pooled (a warm sandbox is claimed)"
    unset logscale y
    set yrange [*:*]
    set xtics norotate
    set style data linespoints
}

# ------------------------------------------------------------------ latency CDFs
if (exists("serve_load")) {
    set output plots."/serve_load_latency_cdf.png"
    set title "berth serve under load: turn latency (one echo cell a turn, 10 turns per conversation, all at once)\n{/*0.8 ".footer."}"
    set xlabel "turn latency, request to end of stream (ms, log scale)"
    set ylabel "fraction of turns at or below (CDF)"
    set logscale x
    set yrange [0:1]
    set key top left width 1 title "conversations"
    plot for [i=1:words(serve_load)] data."/serve_load_cdf_".word(serve_load,i).".dat" \
        using 1:2 with steps lw 2 title word(serve_load,i)
    unset logscale x
    set yrange [*:*]
    set key width 0 title ""
}
if (exists("turns_per_second")) {
    set output plots."/turns_per_second_latency_cdf.png"
    set title "Scripted turns, no code, one core: turn latency (message to turn end, queued behind the others)\n{/*0.8 ".footer."}"
    set xlabel "turn latency (ms, log scale)"
    set ylabel "fraction of turns at or below (CDF)"
    set logscale x
    set yrange [0:1]
    set key top left width 1 title "conversations"
    plot for [i=1:words(turns_per_second)] data."/turns_per_second_cdf_".word(turns_per_second,i).".dat" \
        using 1:2 with steps lw 2 title word(turns_per_second,i)
    unset logscale x
    set yrange [*:*]
    set key width 0 title ""
}

# ------------------------------------------------------------------ scale curves
# x spans the points measured, with a margin either side.
set autoscale xfix
set offsets graph 0.04, graph 0.04, 0, 0
if (exists("serve_load")) {
    set output plots."/serve_load_scale.png"
    set title "berth serve under load vs number of conversations (sandboxd, echo provider)\n{/*0.8 ".footer."}"
    set xlabel "conversations, all driven at once (log scale)"
    set ylabel "throughput (turns/s)"
    set y2label "turn latency (ms, log scale)"
    set key bottom right
    set logscale x
    set logscale y2
    set yrange [0:*]
    set ytics nomirror
    set y2tics
    plot data."/serve_load_scale.dat" using 1:2 axes x1y1 lw 2 pt 7 title "turns/s (left)", \
         "" using 1:3 axes x1y2 dt 2 pt 5 title "latency p50 (right)", \
         "" using 1:5 axes x1y2 dt 3 pt 9 title "latency p99 (right)", \
         "" using 1:6 axes x1y2 dt 4 pt 11 title "latency max (right)"
    unset logscale
    unset y2tics
    unset y2label
    set ytics mirror
    set yrange [*:*]
}
if (exists("turns_per_second")) {
    set output plots."/turns_per_second_scale.png"
    set title "Scripted turns per second vs number of conversations (no code, pinned to one core, 10 turns each)\n{/*0.8 ".footer."}"
    set xlabel "conversations (log scale)"
    set ylabel "throughput (turns/s)"
    set y2label "CPU per turn (µs)"
    set key bottom left
    set logscale x
    set yrange [0:*]
    set y2range [0:*]
    set ytics nomirror
    set y2tics
    plot data."/turns_per_second_scale.dat" using 1:2 axes x1y1 lw 2 pt 7 title "turns/s, wall (left)", \
         "" using 1:3 axes x1y1 dt 2 pt 5 title "turns/s of CPU (left)", \
         "" using 1:4 axes x1y2 dt 3 pt 9 title "CPU µs per turn (right)", \
         20000 axes x1y1 with lines dt 4 lc rgb "#888888" title "target 20 000 turns/s"
    unset logscale
    unset y2tics
    unset y2label
    set ytics mirror
    set yrange [*:*]
    set y2range [*:*]
}
if (exists("turns_held")) {
    set output plots."/turns_held_scale.png"
    set title "1 000 conversations turning beside conversations held idle (suspended, stored; 3 turns each)\n{/*0.8 ".footer."}"
    set xlabel "conversations held (log scale; none is drawn at 100)"
    set ylabel "throughput of the 1 000 (turns/s, wall)"
    set key bottom left
    set logscale x
    set yrange [0:*]
    plot for [i=1:words(turns_held)] data."/turns_held_".word(turns_held,i).".dat" \
        using 1:2 lw 2 pt 7 title word(turns_held,i)." store", \
         40000 with lines dt 4 lc rgb "#888888" title "target 40 000 turns/s at 100 000 held"
    unset logscale
    set yrange [*:*]
}
if (exists("idle_memory")) {
    set output plots."/idle_memory_scale.png"
    set title "Memory per conversation vs number of conversations in one host (no daemon)\n{/*0.8 ".footer."}"
    set xlabel "conversations in the host (log scale)"
    set ylabel "bytes per conversation (B)"
    set key inside top right maxrows 3
    set logscale x
    set yrange [0:12000]
    plot data."/idle_memory_scale.dat" using 1:2 lw 2 pt 7 title "opened: allocator", \
         "" using 1:5 lw 2 pt 5 title "after one turn, idle: allocator", \
         "" using 1:6 dt 2 pt 4 title "after one turn, idle: of which Lua", \
         "" using 1:7 dt 3 pt 9 title "after one turn, idle: RSS growth", \
         "" using 1:8 dt 4 pt 11 title "suspended: allocator", \
         8192 with lines dt 5 lc rgb "#888888" title "target 8 KiB (allocator)"
    unset logscale
    set yrange [*:*]
}
if (exists("data") && system("test -s ".data."/client_verify.dat && echo y") eq "y") {
    set output plots."/client_verify.png"
    set title "Client-side verification of a session cell vs stdout size (best of 5 rounds)\n{/*0.8 ".footer."}"
    set xlabel "cell stdout (bytes, log scale)"
    set ylabel "time per answer (µs, log scale)"
    set key inside top left
    set logscale xy
    set xtics ("1 KiB" 1024, "32 KiB" 32768, "1 MiB" 1048576)
    plot data."/client_verify.dat" using 1:2 lw 2 pt 7 title "verify the answer (map, digests, chain)", \
         "" using 1:3 dt 2 pt 5 title "bare SHA-256 of the stdout (floor)", \
         "" using 1:4 dt 3 pt 9 title "base64 decoding of the wire form alone", \
         data."/client_e2e.dat" using 1:2 dt 4 pt 11 title "client CPU per call end to end (sandboxd echo)"
    unset logscale
    set xtics auto
}
