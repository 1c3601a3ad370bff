# shellcheck shell=bash
# Shared by the project's commands (test/run, test/demo/run, test/bench/run):
# install what is missing, build and install idempo, run throwaway clusters.
# Source it; it defines functions only (and ROOT, PG_MAJOR, PGBIN, PGXS_DIR).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$ROOT/test/lib/servers.sh"

# The PostgreSQL major under test: PG_MAJOR, else the one the host's Debian release packages.
# Every path of a server is derived from it here, and only here.
if [ -z "${PG_MAJOR:-}" ]; then
  for PG_MAJOR in $SUPPORTED_MAJORS; do major_is_native "$PG_MAJOR" && break; done
fi
# IDEMPO_PG_PREFIX: a relocated copy of Debian's install (cp -a of /usr/lib/postgresql/M,
# /usr/share/postgresql/M and /usr/include/postgresql under PREFIX/usr, as test/mutation/run
# makes): build_and_install installs there, not into the system, so a suite run by hand cannot
# change the library a running test server (test/run, CI) has loaded.
PGBIN=${IDEMPO_PG_PREFIX:+$IDEMPO_PG_PREFIX}/usr/lib/postgresql/$PG_MAJOR/bin
# shellcheck disable=SC2034  # used by the scripts that source this file
PGXS_DIR=${IDEMPO_PG_PREFIX:+$IDEMPO_PG_PREFIX}/usr/lib/postgresql/$PG_MAJOR/lib/pgxs
if [ -n "${IDEMPO_PG_PREFIX:-}" ] && [ ! -x "$PGBIN/pg_config" ]; then
  printf 'error: IDEMPO_PG_PREFIX=%s has no %s\n' "$IDEMPO_PG_PREFIX" "$PGBIN/pg_config" >&2; exit 2
fi
export PG_MAJOR

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 2; }

# Installs the Debian packages that are not installed yet.
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root to install them"
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_get_waiting update -qq || die "apt-get update failed"
  apt_get_waiting install -y -qq --no-install-recommends "${missing[@]}" || die "apt-get install failed"
}

# ensure_pg_extension NAME PACKAGE: the extension NAME for the server under test, from Debian's
# PACKAGE, or else from Debian's source package built in a chroot by ensure_chroot (servers.sh)
# when the archive has no build for this major yet.  Prints why it cannot be had (one line) and
# fails then: the suite that needs it is skipped with that reason.
ensure_pg_extension() {
  local ext=$1 pkg=$2 cand
  if [ -f "$("$PGBIN/pg_config" --sharedir)/extension/$ext.control" ]; then
    [ -f "/var/lib/idempo/from-source/$pkg" ] && log "$ext: $(cat "/var/lib/idempo/from-source/$pkg")"
    return 0
  fi
  if [ -f "/var/lib/idempo/unavailable/$pkg" ]; then cat "/var/lib/idempo/unavailable/$pkg"; return 1; fi
  cand=$(apt-cache policy "$pkg" 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
    [ "$(id -u)" -eq 0 ] && apt_get_waiting update -qq >/dev/null 2>&1
    cand=$(apt-cache policy "$pkg" 2>/dev/null | sed -n 's/^ *Candidate: //p')
  fi
  if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
    echo "no package $pkg in Debian $(host_release)'s archive"; return 1
  fi
  ( ensure_packages "$pkg" ) >&2 || { echo "$pkg did not install"; return 1; }
}

# apt-get ARGS, waiting while another apt or dpkg holds its locks (an unattended upgrade, or this
# suite's other majors installing debootstrap at the same time) instead of failing: up to 20
# minutes, then the error.  DPkg::Lock::Timeout covers dpkg's lock; the lists lock of
# "apt-get update" is not covered by it, hence the loop on apt's own message.
apt_get_waiting() {
  local out rc waited=0
  while :; do
    out=$(apt-get -o DPkg::Lock::Timeout=120 "$@" 2>&1); rc=$?
    if [ "$rc" -ne 0 ] && [ "$waited" -lt 1200 ] &&
       printf '%s\n' "$out" | grep -qE 'Could not get lock|Unable to lock|Unable to acquire the dpkg frontend lock'; then
      [ "$waited" -eq 0 ] && log "apt is busy (another apt-get holds its lock): waiting"
      sleep 5; waited=$((waited + 5)); continue
    fi
    [ "$rc" -eq 0 ] || printf '%s\n' "$out" | tail -20 >&2
    return "$rc"
  done
}

# shellcheck disable=SC2034  # used by the scripts that source this file
CORE_PACKAGES=(make gcc libc6-dev "postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR")

# Builds idempo and installs it into the server's directories.
build_and_install() {
  local out
  out=$(make -C "$ROOT" PG_CONFIG="$PGBIN/pg_config" 2>&1) || { printf '%s\n' "$out" >&2; die "build failed"; }
  out=$(make -C "$ROOT" PG_CONFIG="$PGBIN/pg_config" install 2>&1) || { printf '%s\n' "$out" >&2; die "install failed"; }
}

# The user that owns test clusters: initdb refuses root.
if [ "$(id -u)" -eq 0 ]; then PG_USER=postgres; else PG_USER=$(id -un); fi
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$PG_USER" -- "$@"; else "$@"; fi
}

# A fresh directory that the cluster user owns (the clone may be unreadable to it).
new_workdir() {
  local d
  d=$(mktemp -d "${TMPDIR:-/tmp}/idempo-$1.XXXXXX") || die "mktemp failed"
  chmod 755 "$d"
  [ "$(id -u)" -eq 0 ] && chown "$PG_USER" "$d"
  printf '%s\n' "$d"
}

# start_cluster DIR PORT [extra postgresql.conf lines...]: initdb + start, on a socket in DIR only.
start_cluster() {
  local dir=$1 port=$2; shift 2
  (cd "$dir" && as_pg "$PGBIN/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1) \
    || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  {
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$dir'"
    echo "port = $port"
    echo "shared_preload_libraries = 'idempo'"
    echo "max_worker_processes = 32"
    echo "log_line_prefix = '%m [%p] %q%a '"
    printf '%s\n' "$@"
  } | as_pg tee -a "$dir/data/postgresql.conf" >/dev/null
  (cd "$dir" && as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null) \
    || { cat "$dir/server.log" >&2; die "server did not start"; }
}

stop_cluster() {
  [ -f "$1/data/postmaster.pid" ] && (cd "$1" && as_pg "$PGBIN/pg_ctl" -D "$1/data" -m fast -w stop >/dev/null 2>&1)
  return 0
}

# psql against a cluster started by start_cluster: cpsql DIR PORT [psql args...]
cpsql() {
  local dir=$1 port=$2; shift 2
  (cd "$dir" && as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres "$@")
}
