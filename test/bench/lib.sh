# shellcheck shell=bash
# Shared by the benchmark commands of test/bench (run, levers): result files, pgbench runs (one
# script, or several interleaved in one run), latency statistics from pgbench's logs.  Source it
# after test/lib/common.sh with WORK, PORT, RES, LOGS, BENCH, FIXTURE, HELD and START set.

FAILED=0
fail() { log "FAILED: $*"; FAILED=$((FAILED + 1)); }
section() { log "== [$(($(date +%s) - START)) s] $*"; }
sql() { local db=$1; shift; cpsql "$WORK" "$PORT" -d "$db" -At "$@"; }
meta() { printf '%s\t%s\n' "$1" "$2" >>"$RES/meta.tsv"; }
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f\n", a - b }'; }   # seconds since $(now) T0

# restart pinned|unpinned: with "pinned", the postmaster and so every backend run on core
# $BENCH_CORE (default 0; another core lets a second benchmark run beside a long one, e.g. a load).
restart() {
  local pin=(); [ "$1" = pinned ] && pin=(taskset -c "${BENCH_CORE:-0}")
  stop_cluster "$WORK"
  (cd "$WORK" && as_pg "${pin[@]}" "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w -t 60 start \
    >/dev/null) || die "server did not restart"
}

# stats_settled DB: waits until no other client is connected to DB.  A backend reports its
# table statistics as it exits, before it leaves pg_stat_activity, so after this pg_stat_user_tables
# holds what the pgbench or psql sessions before did.
stats_settled() {
  local i
  for i in $(seq 100); do
    [ "$(sql "$1" -c "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                        AND backend_type = 'client backend' AND pid <> pg_backend_pid()")" = 0 ] && return 0
    sleep 0.1
  done
  fail "clients of $1 still connected after 10 s"
}

# Modes, named NpinSYNC or NcliSYNC (1pin-off, 8cli-on, ...): N clients; "pin": pgbench on that core
# (the server is pinned by restart), "cli": unpinned; synchronous_commit off or on.  pgbench runs
# a thread per client, up to 4.
mode() {
  [[ $1 =~ ^([0-9]+)(pin|cli)-(on|off)$ ]] || die "unknown mode $1"
  CLIENTS=${BASH_REMATCH[1]} SYNC=${BASH_REMATCH[3]} PIN=()
  [ "${BASH_REMATCH[2]}" = pin ] && PIN=(taskset -c "${BENCH_CORE:-0}")
  THREADS=$((CLIENTS < 4 ? CLIENTS : 4))
}

# Reads pgbench --log lines on stdin; prints "avg p99 count p50 max" of latencies (µs) of the
# transactions that ended within [FROM, TO] (epoch seconds; default: all).
# shellcheck disable=SC2120  # FROM and TO are optional: test/bench/run passes them, bench() does not
latency_stats() {
  awk -v a="${1:-0}" -v b="${2:-1e18}" '{ t = $5 + $6 / 1e6; if (t >= a && t <= b) print $3 }' | sort -n |
    awk 'function q(p,  i) { i = int(NR * p); if (i < NR * p) i++; return v[i] }
         { v[NR] = $1; s += $1 }
         END { if (NR == 0) { print "0 0 0 0 0"; exit }
               printf "%.1f %.1f %d %.1f %.1f\n", s / NR, q(0.99), NR, q(0.5), v[NR] }'
}

# bench SECTION MODE VARIANT ROUND DB SCRIPT PGBENCH-ARGS...: one pgbench run, one line in runs.tsv
# (section mode variant round clients tps avg_us p99_us transactions failed p50_us max_us).  KEEP_LOG=1 keeps the log.
bench() {
  local section=$1 md=$2 variant=$3 round=$4 db=$5 script=$6 out rc tps id avg p99 n opts; shift 6
  id=$section.$md.$variant.$round
  mode "$md"
  # variants named *_spi run idempo's script with every write through SQL (direct.c off)
  opts="-c synchronous_commit=$SYNC"
  case $variant in *_spi) opts="$opts -c idempo.direct_writes=off" ;; esac
  out=$(cd "$LOGS" && PGOPTIONS="$opts" "${PIN[@]}" "$PGBIN/pgbench" -n -M prepared \
        -c "$CLIENTS" -j "$THREADS" -D fixture="$FIXTURE" -D held="$HELD" "$@" -l --log-prefix="$id" \
        -f "$BENCH/pgbench/$script.sql" -h "$WORK" -p "$PORT" -U postgres "$db" 2>&1); rc=$?
  tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
  if [ $rc -ne 0 ] || [ -z "$tps" ] || grep -qE 'failed transactions: [1-9]|aborted' <<<"$out"; then
    fail "pgbench $id"; printf '%s\n' "$out" | tail -5 >&2; tps=${tps:-0}
  fi
  read -r avg p99 n p50 max < <(cat "$LOGS/$id".* 2>/dev/null | latency_stats)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$section" "$md" "$variant" "$round" "$CLIENTS" \
    "$tps" "$avg" "$p99" "$n" $((rc != 0)) "$p50" "$max" >>"$RES/runs.tsv"
  log "  $id: $tps tps, avg $avg µs, p99 $p99 µs"
  [ "${KEEP_LOG:-0}" = 1 ] || rm -f "$LOGS/$id".*
}

# bench_mixed SECTION MODE ROUND DB "VARIANTS" PGBENCH-ARGS...: one pgbench run whose transactions
# are the variants' scripts chosen at random (equal weights), so that whatever the machine does
# meanwhile hits every variant alike; one line per variant in runs.tsv, its tps being clients * 1e6
# / its average latency (Little's law: what a run of that variant alone would do at that
# latency).  MIXED_SPI=1: with idempo.direct_writes = off (variants named *_spi).
bench_mixed() {
  local section=$1 md=$2 round=$3 db=$4 out rc id i avg p99 n opts; local -a vs args=(); shift 4
  read -ra vs <<<"$1"; shift
  mode "$md"
  opts="-c synchronous_commit=$SYNC"
  [ "${MIXED_SPI:-0}" = 1 ] && opts="$opts -c idempo.direct_writes=off"
  id=$section.$md.mixed$([ "${MIXED_SPI:-0}" = 1 ] && echo _spi).$round
  for i in "${vs[@]}"; do i=${i%_spi}; args+=(-f "$BENCH/pgbench/${i%_mixed}.sql"); done
  out=$(cd "$LOGS" && PGOPTIONS="$opts" "${PIN[@]}" "$PGBIN/pgbench" -n -M prepared \
        -c "$CLIENTS" -j "$THREADS" -D fixture="$FIXTURE" -D held="$HELD" "$@" -l --log-prefix="$id" \
        "${args[@]}" -h "$WORK" -p "$PORT" -U postgres "$db" 2>&1); rc=$?
  if [ $rc -ne 0 ] || ! grep -q '^tps = ' <<<"$out" || grep -qE 'failed transactions: [1-9]|aborted' <<<"$out"; then
    fail "pgbench $id"; printf '%s\n' "$out" | tail -5 >&2
  fi
  for i in "${!vs[@]}"; do      # pgbench logs the script's number, from 0, in column 4
    read -r avg p99 n p50 max < <(cat "$LOGS/$id".* 2>/dev/null | awk -v s="$i" '$4 == s' | latency_stats)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$section" "$md" "${vs[$i]}" "$round" "$CLIENTS" \
      "$(awk -v a="$avg" -v c="$CLIENTS" 'BEGIN { printf "%.1f", (a > 0 ? c * 1e6 / a : 0) }')" "$avg" "$p99" "$n" \
      $((rc != 0)) "$p50" "$max" >>"$RES/runs.tsv"
    log "  $id ${vs[$i]}: avg $avg µs, p99 $p99 µs, $n transactions"
  done
  [ "${KEEP_LOG:-0}" = 1 ] || rm -f "$LOGS/$id".*
}


# load_rows DB STATUS ROWS TTL [SCOPE]: replace idempo.operations with ROWS valid rows (load.sql); prints
# seconds; fails (non-zero) if the load failed, which rolls it back and leaves the old rows.
load_rows() {
  local t0 rc; t0=$(now)
  sql "$1" -v scope="${5:-bench}" -v status="$2" -v n="$3" -v ttl="$4" -f "$BENCH/load.sql" >/dev/null; rc=$?
  since "$t0"
  return $rc
}
