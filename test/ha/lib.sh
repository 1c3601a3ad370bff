# shellcheck shell=bash
# The HA harness: etcd + three Patroni-managed PostgreSQL nodes with idempo preloaded, a plain
# "warehouse" server that never fails over, PgBouncer in transaction pooling mode.  Sourced by
# test/ha/run (after test/lib/common.sh); defines variables and functions only.
#
# Everything listens on 127.0.0.1 only, runs as the cluster user ($PG_USER) and lives in $HA_WORK.
# Ports (override any of them):
#   HA_PG_PORT      the warehouse's PostgreSQL port (default 5660); the nodes use +1, +2, +3
#                   (5661..5663), PgBouncer +4 (5664)
#   HA_REST_PORT    Patroni REST API of node 1 (default 8661; nodes +0..+2)
#   HA_ETCD_PORT    etcd client port (default 2391), its peer port +1
# HA_PGBIN: the PostgreSQL bin directory to use (default: the system's $PGBIN).

HA_PG_PORT=${HA_PG_PORT:-5660}
HA_REST_PORT=${HA_REST_PORT:-8661}
HA_ETCD_PORT=${HA_ETCD_PORT:-2391}
HA_PGBIN=${HA_PGBIN:-$PGBIN}
HA_NODES=(node1 node2 node3)
HA_SCOPE=idempo-ha
# Patroni's timings: a stalled leader loses its lock after HA_TTL seconds.
HA_TTL=${HA_TTL:-12}
HA_LOOP_WAIT=${HA_LOOP_WAIT:-1}
HA_RETRY_TIMEOUT=${HA_RETRY_TIMEOUT:-5}

ha_node_port() { echo $((HA_PG_PORT + $1)); }          # ha_node_port 1..3
ha_rest_port() { echo $((HA_REST_PORT + $1 - 1)); }
ha_bouncer_port() { echo $((HA_PG_PORT + 4)); }
ha_warehouse_port() { echo "$HA_PG_PORT"; }

# The libpq connection string an application uses: every node, the one that accepts writes.
ha_dsn() {  # ha_dsn DBNAME [target_session_attrs]
  echo "host=127.0.0.1,127.0.0.1,127.0.0.1 port=$(ha_node_port 1),$(ha_node_port 2),$(ha_node_port 3)" \
       "user=postgres dbname=$1 target_session_attrs=${2:-read-write} connect_timeout=3"
}

ha_psql() {  # ha_psql NODE_NUMBER [psql args...]: psql on one node, over TCP
  local n=$1; shift
  as_pg "$HA_PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(ha_node_port "$n")" -U postgres "$@"
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND (every 0.2 s) until it succeeds.
wait_for() {
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -ge "$deadline" ] && { log "timed out after ${secs}s waiting for $what"; return 1; }
    sleep 0.2
  done
}

rest_ok() { curl -fs -m 2 -o /dev/null "http://127.0.0.1:$(ha_rest_port "$1")/$2"; }  # rest_ok N ENDPOINT

# The node number (1..3) that Patroni's REST API reports as the leader; fails if none is.
ha_leader() {
  local n
  for n in 1 2 3; do rest_ok "$n" leader && { echo "$n"; return 0; }; done
  return 1
}

# Healthy: a leader, and the two others streaming from it (REST /replica answers 200 on a
# running replica that has a leader to follow); in synchronous mode also a synchronous standby.
ha_healthy() {
  local leader n
  leader=$(ha_leader) || return 1
  for n in 1 2 3; do
    [ "$n" = "$leader" ] && continue
    rest_ok "$n" "replica" || return 1
  done
  if [ "${HA_SYNC:-1}" = 1 ]; then rest_ok 1 "sync" || rest_ok 2 "sync" || rest_ok 3 "sync" || return 1; fi
  # the replicas stream (not restoring or rewinding)
  [ "$(ha_psql "$leader" -d postgres -Atc "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 2 ]
}

# as_pg_bg PIDFILE LOGFILE COMMAND...: COMMAND in the background as the cluster user, in a session
# of its own; PIDFILE gets its own pid (not runuser's).
as_pg_bg() {
  local pidfile=$1 logfile=$2; shift 2
  : >"$pidfile"; [ "$(id -u)" -eq 0 ] && chown "$PG_USER" "$pidfile"
  # shellcheck disable=SC2016  # the script in single quotes is bash -c's: its variables expand there
  as_pg setsid bash -c 'p=$0 l=$1; shift; echo $$ >"$p"; exec "$@" >>"$l" 2>&1' "$pidfile" "$logfile" "$@" </dev/null &
  wait_for 10 "$pidfile" test -s "$pidfile"
}

ha_patronictl() { as_pg patronictl -c "$HA_WORK/node1.yml" "$@"; }

ha_start_etcd() {
  mkdir -p "$HA_WORK/etcd" && chown "$PG_USER" "$HA_WORK/etcd" 2>/dev/null
  chmod 700 "$HA_WORK/etcd"
  (cd "$HA_WORK" && as_pg_bg "$HA_WORK/etcd.pid" "$HA_WORK/etcd.log" etcd --name ha --data-dir "$HA_WORK/etcd" \
    --listen-client-urls "http://127.0.0.1:$HA_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$HA_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((HA_ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((HA_ETCD_PORT + 1))" \
    --initial-cluster "ha=http://127.0.0.1:$((HA_ETCD_PORT + 1))" --enable-v2=true)
  wait_for 30 "etcd" curl -fsS -m 2 "http://127.0.0.1:$HA_ETCD_PORT/health" \
    || { tail -20 "$HA_WORK/etcd.log" >&2; return 1; }
}

# ha_write_config N SYNC(1|0): node N's Patroni configuration.
ha_write_config() {
  local n=$1 sync=$2 name=${HA_NODES[$(($1 - 1))]} sm
  if [ "$sync" = 1 ]; then sm=true; else sm=false; fi
  cat >"$HA_WORK/node$n.yml" <<EOF
scope: $HA_SCOPE
namespace: /idempo-ha/
name: $name
log:
  level: INFO
restapi:
  listen: 127.0.0.1:$(ha_rest_port "$n")
  connect_address: 127.0.0.1:$(ha_rest_port "$n")
# etcd's v2 API: Patroni 3.0.2's etcd3 backend can overwrite the leader key when a leader that
# was frozen longer than the TTL resumes (two leaders in turn, a node stranded on a newer
# timeline; fixed in Patroni 3.0.3, patroni/patroni#2689).  The v2 backend updates it with
# compare-and-swap.
etcd:
  hosts: 127.0.0.1:$HA_ETCD_PORT
bootstrap:
  dcs:
    ttl: $HA_TTL
    loop_wait: $HA_LOOP_WAIT
    retry_timeout: $HA_RETRY_TIMEOUT
    maximum_lag_on_failover: 16777216
    # a crashed primary fails over instead of restarting in place
    primary_start_timeout: 0
    synchronous_mode: $sm
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        shared_preload_libraries: idempo
        max_worker_processes: 16
        wal_log_hints: 'on'
        hot_standby: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        idempo.sweep_interval: 1s
        fsync: 'off'
  initdb:
  - encoding: UTF8
  - locale: C
  - auth: trust
postgresql:
  listen: 127.0.0.1:$(ha_node_port "$n")
  connect_address: 127.0.0.1:$(ha_node_port "$n")
  data_dir: $HA_WORK/$name/data
  bin_dir: $HA_PGBIN
  pgpass: $HA_WORK/$name/pgpass
  remove_data_directory_on_rewind_failure: true
  authentication:
    superuser: {username: postgres, password: postgres}
    replication: {username: replicator, password: replicator}
    rewind: {username: postgres, password: postgres}
  parameters:
    unix_socket_directories: $HA_WORK/$name
    logging_collector: 'on'
    log_directory: log
    log_statement: ${HA_LOG_STATEMENT:-none}
    log_line_prefix: '%m [%p] %q%a '
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
tags: {}
EOF
  mkdir -p "$HA_WORK/$name"; chmod 700 "$HA_WORK/$name"
  [ "$(id -u)" -eq 0 ] && chown "$PG_USER" "$HA_WORK/node$n.yml" "$HA_WORK/$name"
  return 0
}

ha_start_node() {  # ha_start_node N
  local n=$1
  (cd "$HA_WORK" && as_pg_bg "$HA_WORK/node$n.pid" "$HA_WORK/node$n.log" patroni "$HA_WORK/node$n.yml")
}

# ha_start SYNC(1|0): etcd and the three nodes (fresh), waits until the cluster is healthy.
ha_start() {
  HA_SYNC=$1
  local n
  ha_start_etcd || return 1
  for n in 1 2 3; do ha_write_config "$n" "$HA_SYNC"; done
  ha_start_node 1
  wait_for 120 "a leader" ha_leader || { tail -30 "$HA_WORK/node1.log" >&2; return 1; }
  ha_start_node 2; ha_start_node 3
  wait_for 180 "two streaming replicas" ha_healthy || { ha_patronictl list >&2; tail -20 "$HA_WORK"/node*.log >&2; return 1; }
}

# ha_stop: Patroni stops its PostgreSQL on SIGTERM; then etcd.  Anything left is stopped hard.
ha_stop() {
  local n pid name
  [ -n "${HA_WORK:-}" ] || return 0
  # a run that ended in the middle of a stall leaves processes stopped: continue them all first
  for name in "${HA_NODES[@]}"; do
    [ -f "$HA_WORK/$name/data/postmaster.pid" ] || continue
    pid=$(head -1 "$HA_WORK/$name/data/postmaster.pid")
    kill -CONT "$pid" $(pgrep -P "$pid") 2>/dev/null
  done
  for n in 1 2 3; do
    pid=$(cat "$HA_WORK/node$n.pid" 2>/dev/null) || continue
    # (runuser, its parent, stops itself when Patroni is stopped)
    kill -CONT "$pid" "$(ps -o ppid= -p "$pid" 2>/dev/null)" 2>/dev/null; kill -TERM "$pid" 2>/dev/null
  done
  for n in 1 2 3; do
    pid=$(cat "$HA_WORK/node$n.pid" 2>/dev/null) || continue
    wait_for 60 "patroni $n to stop" bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null
    rm -f "$HA_WORK/node$n.pid"
  done
  for name in "${HA_NODES[@]}"; do
    if [ -f "$HA_WORK/$name/data/postmaster.pid" ]; then
      pid=$(head -1 "$HA_WORK/$name/data/postmaster.pid")
      kill -CONT "$pid" 2>/dev/null
      as_pg "$HA_PGBIN/pg_ctl" -D "$HA_WORK/$name/data" -m immediate -w stop >/dev/null 2>&1
    fi
  done
  if [ -f "$HA_WORK/etcd.pid" ]; then
    pid=$(cat "$HA_WORK/etcd.pid"); kill -TERM "$pid" 2>/dev/null
    wait_for 30 "etcd to stop" bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null
    rm -f "$HA_WORK/etcd.pid"
  fi
}

# ha_reset: stops everything and removes the cluster's state (for the next mode's run).
ha_reset() {
  ha_stop
  [ "${KEEP_WORKDIR:-0}" = 1 ] && { mkdir -p "$HA_WORK/kept.$$.$SECONDS"; mv "$HA_WORK"/node[123] "$HA_WORK"/node[123].* "$HA_WORK/etcd" "$HA_WORK/kept.$$.$SECONDS/" 2>/dev/null; }
  rm -rf "$HA_WORK/etcd" "$HA_WORK"/node[123] "$HA_WORK"/node[123].yml
}

# The warehouse: a plain server (socket only, in $HA_WORK/warehouse) that never fails over.
ha_start_warehouse() {
  mkdir -p "$HA_WORK/warehouse"; [ "$(id -u)" -eq 0 ] && chown "$PG_USER" "$HA_WORK/warehouse"
  PGBIN=$HA_PGBIN start_cluster "$HA_WORK/warehouse" "$(ha_warehouse_port)" "fsync = off"
}
ha_stop_warehouse() { PGBIN=$HA_PGBIN stop_cluster "$HA_WORK/warehouse"; }

# PgBouncer in transaction pooling mode in front of node N (the leader when it starts).
ha_start_bouncer() {  # ha_start_bouncer NODE_NUMBER
  local n=$1 d=$HA_WORK/bouncer
  mkdir -p "$d"
  cat >"$d/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$(ha_node_port "$n")
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $(ha_bouncer_port)
unix_socket_dir = $d
auth_type = trust
auth_file = $d/userlist.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
admin_users = postgres
logfile = $d/pgbouncer.log
pidfile = $d/pgbouncer.pid
EOF
  echo '"postgres" ""' >"$d/userlist.txt"
  [ "$(id -u)" -eq 0 ] && chown -R "$PG_USER" "$d"
  (cd "$d" && as_pg pgbouncer -d "$d/pgbouncer.ini" >/dev/null) || return 1
  wait_for 30 "pgbouncer" as_pg "$HA_PGBIN/psql" -X -h 127.0.0.1 -p "$(ha_bouncer_port)" -U postgres -d postgres -c 'SELECT 1'
}
ha_stop_bouncer() {
  local pid
  pid=$(cat "$HA_WORK/bouncer/pgbouncer.pid" 2>/dev/null) || return 0
  kill -TERM "$pid" 2>/dev/null
  wait_for 30 "pgbouncer to stop" bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null
  return 0
}
