# shellcheck shell=bash
# Where each supported PostgreSQL major's server comes from.  Sourced by test/run (after
# common.sh); defines functions only.
#
# Every major is Debian's own package of it, from the Debian release that ships it: the host's
# release runs natively, any other runs in a chroot of its release made with debootstrap and
# kept under $IDEMPO_CACHE/chroots/RELEASE, so that a second run reuses it.  The chroot shares
# the host's network (loopback); /proc, /dev, /dev/pts and /dev/shm are mounted while a command
# runs in it.  Nothing here touches the host's apt configuration.

SUPPORTED_MAJORS="15 17 18 19"
IDEMPO_CACHE=${IDEMPO_CACHE:-/var/cache/idempo}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# The Debian release that packages a major (18: the development distribution; 19: experimental,
# which is not a whole distribution but a few packages on top of sid: its chroot is a sid chroot
# of its own, with experimental as an extra apt source, so that 18's and 19's runs each have one).
debian_release_of() {
  case "$1" in
    15) echo bookworm ;;
    17) echo trixie ;;
    18) echo sid ;;
    19) echo experimental ;;
    *) return 1 ;;
  esac
}

# The distribution debootstrap makes a release's chroot from.
debootstrap_suite_of() { case "$1" in experimental) echo sid ;; *) echo "$1" ;; esac; }

# apt_pin_of MAJOR: for a release on top of the bootstrapped one, an apt preferences stanza
# that takes the major's own packages (and the libpq they need) from it and nothing else: not
# "apt-get -t experimental", which takes every package of the transaction that experimental
# has from there (a perl transition in experimental made that uninstallable).  Priority 500, the
# same as unstable's: the newer build of the two wins, so that the release uploaded to unstable
# (19.0 after experimental's 19~rc1) replaces the prerelease; 990 kept experimental's for good.
# test/lib/apt-pin-selftest checks it.
apt_pin_of() {
  case "$(debian_release_of "$1")" in
    experimental) printf 'Package: postgresql-%s postgresql-%s-* postgresql-*-%s libpq5 libpq-dev libpq-oauth\nPin: release a=experimental\nPin-Priority: 500\n' "$1" "$1" "$1" ;;
  esac
}

# Base packages that Debian builds for each major (pgTAP, pg_cron) lag behind a new major: when
# the archive has none for it, ensure_chroot builds them from Debian's source package of the
# extension (the source name for each such package; none for anything else).
debian_source_of() {
  case "$1" in
    postgresql-*-pgtap) echo pgtap ;;
    postgresql-*-cron) echo pg-cron ;;
    *) return 1 ;;
  esac
}

# When Debian has neither a build nor a source package for the major (pg_cron for 19: its pg-cron
# source answers 404 on the mirror), an upstream snapshot in the vendor directory (find_vendor_dir)
# that supports it: the tarball's name pattern for each such package, none for anything else.
vendored_source_of() {
  case "$1" in
    postgresql-19-cron) echo 'pg_cron-main-*.tar.gz' ;;
    *) return 1 ;;
  esac
}

host_release() { (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-unknown}"); }

# True when the host's own release packages the major (no chroot needed).
major_is_native() { [ "$(debian_release_of "$1")" = "$(host_release)" ]; }

chroot_dir_of() { echo "$IDEMPO_CACHE/chroots/$(debian_release_of "$1")"; }

# The packages a chroot starts with: the server, its headers and what the suites install on a
# host (their ensure_packages lines), in one apt transaction; a suite installs anything missing
# itself, and the cached chroot keeps it.
chroot_base_packages() {
  local m=$1
  echo postgresql-"$m" postgresql-server-dev-"$m" postgresql-"$m"-pgtap postgresql-"$m"-cron \
    make gcc libc6-dev procps util-linux ca-certificates curl \
    libipc-run-perl libtap-parser-sourcehandler-pgtap-perl python3 python3-psycopg python3-yaml \
    clang libclang-rt-dev nodejs npm prometheus-postgres-exporter gnuplot-nox \
    libkrb5-dev libzstd-dev liblz4-dev libicu-dev libcurl4-openssl-dev flex
}

# ensure_chroot MAJOR: builds the chroot of the major's release unless it is cached (complete
# ones carry .idempo-chroot), then installs whatever of the base packages is missing.
ensure_chroot() {
  local m=$1 rel dir new
  rel=$(debian_release_of "$m") || die "PostgreSQL $m is not supported (supported: $SUPPORTED_MAJORS)"
  dir=$(chroot_dir_of "$m"); new=$dir.new
  mkdir -p "$IDEMPO_CACHE/chroots"
  if [ ! -f "$dir/.idempo-chroot" ]; then
    command -v debootstrap >/dev/null || ensure_packages debootstrap
    log "building the $rel chroot for PostgreSQL $m in $dir (once per machine)"
    # an interrupted debootstrap leaves its mounts in $new (proc, sys; in an LXC container the
    # host's dev/pts and dev/shm, bound): undone first, and rm never crosses into a mount
    chroot_unmount_under "$new"
    rm -rf --one-file-system "$new"
    debootstrap --variant=minbase "$(debootstrap_suite_of "$rel")" "$new" "$DEBIAN_MIRROR" \
      >"$IDEMPO_CACHE/chroots/$rel.debootstrap.log" 2>&1 \
      || { tail -20 "$IDEMPO_CACHE/chroots/$rel.debootstrap.log" >&2; return 1; }
    # a release on top of the bootstrapped one (experimental): its source, from which apt takes
    # only the packages apt_pin_of names
    [ "$(debootstrap_suite_of "$rel")" = "$rel" ] ||
      echo "deb $DEBIAN_MIRROR $rel main" >"$new/etc/apt/sources.list.d/idempo-$rel.list"
    # packages must not start services, and the server package must not create a cluster
    printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"; chmod 755 "$new/usr/sbin/policy-rc.d"
    mkdir -p "$new/etc/postgresql-common"
    echo "create_main_cluster = false" >"$new/etc/postgresql-common/createcluster.conf"
    echo "$rel, debootstrap $(date -u +%FT%TZ)" >"$new/.idempo-chroot"
    mv "$new" "$dir"
  fi
  cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null
  if [ -n "$(apt_pin_of "$m")" ]; then apt_pin_of "$m" >"$dir/etc/apt/preferences.d/idempo-$rel"
  else rm -f "$dir/etc/apt/preferences.d/idempo-$rel"; fi
  # it shares the host's network, so it trusts the certificate authorities the host trusts
  # (e.g. a proxy's, on the way to the npm registry)
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp -f /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
  fi
  [ -f /etc/ssl/certs/ca-certificates.crt ] && mkdir -p "$dir/etc/ssl/certs" &&
    cp -f /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
  # no recommends; keep our createcluster.conf; no fsync while unpacking (a test chroot: half
  # the install time); a development distribution's Release file may be past its Valid-Until
  # on a mirror that is a snapshot
  printf '%s\n' 'APT::Install-Recommends "false";' 'Dpkg::Options { "--force-confold"; "--force-unsafe-io"; };' \
    'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/90idempo"
  local base p pat vendor tarball vendored=
  read -r -a base <<<"$(chroot_base_packages "$m")"
  # the vendored tarballs the chroot may need, checked against the vendor's SHA256SUMS here and
  # copied in (the install script runs before any vendor directory is bound)
  for p in "${base[@]}"; do
    pat=$(vendored_source_of "$p") || continue
    vendor=$(find_vendor_dir) || continue
    tarball=$(cd "$vendor" && compgen -G "$pat" | sort | tail -1) || continue
    (cd "$vendor" && grep " $tarball\$" SHA256SUMS | sha256sum --quiet -c -) >/dev/null 2>&1 ||
      { log "$vendor/$tarball does not match $vendor/SHA256SUMS: not used"; continue; }
    mkdir -p "$dir/usr/src/idempo-vendor" && cp -f "$vendor/$tarball" "$dir/usr/src/idempo-vendor/" &&
      vendored+="$p=/usr/src/idempo-vendor/$tarball "
  done
  in_chroot "$m" MAJOR="$m" RELEASE="$rel" SUITE="$(debootstrap_suite_of "$rel")" \
    MIRROR="$DEBIAN_MIRROR" SOURCES="$(for p in "${base[@]}"; do
      s=$(debian_source_of "$p") && printf '%s=%s ' "$p" "$s"; done)" VENDORED="$vendored" \
    bash -c "$CHROOT_INSTALL_SCRIPT" _ "${base[@]}"
}

# What ensure_chroot runs in the chroot (bash -c, the base packages as arguments; MAJOR, RELEASE,
# SUITE, MIRROR, SOURCES in the environment).  It installs the missing ones (for 19 its own
# packages come from experimental: apt_pin_of).  A package the archive lacks (no candidate) is
# built from its Debian source package (SOURCES: package=source) against the major's pg_config
# and installed with make, or where that cannot be fetched, from a vendored upstream tarball
# (VENDORED: package=tarball, already checked); the build is marked in /var/lib/idempo/from-source/PACKAGE (a warm
# run does not rebuild), and when it cannot be had, /var/lib/idempo/unavailable/PACKAGE says why
# (the suite that needs it is then skipped with that reason: ensure_pg_extension; tried again a
# day later).  Exits non-zero only when an available package failed to install.
# shellcheck disable=SC2016  # a script for bash -c in the chroot: its variables expand there
CHROOT_INSTALL_SCRIPT='
export DEBIAN_FRONTEND=noninteractive
where="Debian $SUITE"; [ "$RELEASE" = "$SUITE" ] || where="Debian $SUITE and $RELEASE"
state=/var/lib/idempo; mkdir -p "$state/from-source" "$state/unavailable"
# a prerelease of the major (19~rc1): the release, or the next candidate, as soon as the archive
# has it (once a day); what was built from source against the old one is built again
own=(postgresql-$MAJOR postgresql-client-$MAJOR postgresql-server-dev-$MAJOR)
was=$(dpkg-query -W -f="\${Version}" "postgresql-$MAJOR" 2>/dev/null)
if [[ $was == *"~"* ]] && [ -z "$(find "$state/prerelease-checked" -mmin -1440 2>/dev/null)" ]; then
  apt-get update -qq >/dev/null && apt-get install -y -qq --only-upgrade "${own[@]}" >/dev/null &&
    touch "$state/prerelease-checked"
  now=$(dpkg-query -W -f="\${Version}" "postgresql-$MAJOR" 2>/dev/null)
  if [ "$now" != "$was" ]; then
    echo "postgresql-$MAJOR: $was -> $now; what was built from source for it is built again" >&2
    rm -f "$state/from-source/"* "$state/unavailable/"*
  fi
fi
missing=(); for p in "$@"; do
  # built from source, or found unavailable less than a day ago (retried after that, or as soon
  # as a vendored tarball that was not tried is there)
  [ -f "$state/from-source/$p" ] && continue
  vt=; for pv in $VENDORED; do [ "${pv%%=*}" = "$p" ] && vt=${pv#*=}; done
  [ -n "$(find "$state/unavailable/$p" -mmin -1440 2>/dev/null)" ] &&
    { [ -z "$vt" ] || grep -qF "${vt##*/}" "$state/unavailable/$p"; } && continue
  dpkg-query -W -f="\${Status}" "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
apt-get update -qq >/dev/null || exit 1
avail=(); absent=()
for p in "${missing[@]}"; do
  if [ -z "$(apt-cache policy "$p" 2>/dev/null | sed -n "s/^ *Candidate: //p" | grep -v "(none)")" ]; then absent+=("$p")
  else avail+=("$p"); fi
done
if [ ${#avail[@]} -gt 0 ]; then
  echo "installing in the chroot: ${avail[*]}" >&2
  apt-get install -y -qq "${avail[@]}" >/dev/null || exit 1
fi
for p in "${absent[@]}"; do
  src=; for ps in $SOURCES; do [ "${ps%%=*}" = "$p" ] && src=${ps#*=}; done
  rm -f "$state/unavailable/$p"
  if [ -z "$src" ]; then
    echo "$p: not in the archive" >&2
    echo "no package $p in $where" >"$state/unavailable/$p"; continue
  fi
  echo "$p is not in the archive: building it from Debian source package $src against PostgreSQL $MAJOR" >&2
  # Debian sources of the bootstrapped distribution: a sources file of the chroot only
  if [ ! -f /etc/apt/sources.list.d/idempo-src.list ]; then
    echo "deb-src $MIRROR $SUITE main" >/etc/apt/sources.list.d/idempo-src.list
    apt-get update -qq >/dev/null || exit 1
  fi
  command -v dpkg-source >/dev/null || apt-get install -y -qq dpkg-dev >/dev/null || exit 1
  build=/usr/src/idempo-$src; rm -rf "$build"; mkdir -p "$build"; chown _apt "$build" 2>/dev/null
  log=$build.log
  what="Debian source $src $(apt-cache showsrc "$src" 2>/dev/null | sed -n "s/^Version: //p" | sort -V | tail -1)"
  (cd "$build" && apt-get source -qq "$src") >"$log" 2>&1
  dir=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -1)
  # a mirror that has the upstream tarball but not the .dsc (seen): apt checked its hash, so
  # build that, and say so
  orig=$(find "$build" -maxdepth 1 -name "*.orig.tar.*" | head -1)
  if [ -z "$dir" ] && [ -n "$orig" ] && tar -C "$build" -xf "$orig" >>"$log" 2>&1; then
    dir=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -1)
    what="$what (its upstream tarball ${orig##*/} only: the mirror had no .dsc, Debian changes not applied)"
  fi
  # nothing from Debian: the vendored upstream snapshot, if there is one (checked on the host)
  vt=; for pv in $VENDORED; do [ "${pv%%=*}" = "$p" ] && vt=${pv#*=}; done
  if [ -z "$dir" ] && [ -n "$vt" ]; then
    fetched=$(grep -m1 "^E:" "$log" | sed -E "s/^E: //; s|https?://[^ ]*/||; s/ *\[IP[^]]*\]//; s/  +/ /g" | cut -c1-80)
    if tar -C "$build" -xzf "$vt" >>"$log" 2>&1; then
      dir=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -1)
      what="the vendored upstream snapshot ${vt##*/} ($what could not be fetched: $fetched)"
    fi
  fi
  if [ -z "$dir" ]; then
    echo "no package $p in $where, and $what could not be fetched: $(grep -m1 "^E:" "$log" |
      sed -E "s/^E: //; s|https?://[^ ]*/||; s/ *\[IP[^]]*\]//; s/  +/ /g" | cut -c1-120)${vt:+ (nor unpacked: ${vt##*/})}" >"$state/unavailable/$p"
    cat "$state/unavailable/$p" >&2; continue
  fi
  pgc=/usr/lib/postgresql/$MAJOR/bin/pg_config
  if (cd "$dir" && make PG_CONFIG="$pgc" USE_PGXS=1 && make PG_CONFIG="$pgc" USE_PGXS=1 install) >>"$log" 2>&1; then
    echo "$what, built with make against $($pgc --version) on $(date -u +%FT%TZ)" >"$state/from-source/$p"
    echo "$p: $(cat "$state/from-source/$p")" >&2
    rm -rf "$build"
  else
    err=$(grep -m1 -E "error:|Error [0-9]|\*\*\*" "$log" | sed "s|$dir/||" | cut -c1-160)
    echo "no package $p in $where, and $what does not build against PostgreSQL $MAJOR: ${err:-see $log in the chroot}" \
      >"$state/unavailable/$p"
    cat "$state/unavailable/$p" >&2
  fi
done
exit 0'

# Mounts what a process in the chroot needs; chroot_umount undoes it (also after a failure).
#
# Every use of a chroot holds its lock ($dir.lock: with_chroot_lock), and every mount is undone
# by an EXIT trap of the (sub)shell that made it (in_chroot, run_major_in_chroot): on an error,
# on "exit", on SIGTERM (bash runs the EXIT trap of a non-interactive shell then too).  What
# only SIGKILL or a lost machine leaves behind is unmounted by the next chroot_mount under the
# lock (mounting over it would hide it for good: each run would undo only its own layer), and
# test/run's last check (chroot_leftovers) fails when a run left a mount or a process there: an
# "rm -rf" of the cache through a live bind of /dev would empty the host's /dev.
CHROOT_MOUNTS=()
chroot_mount() {
  local dir=$1 stale
  if [ "${CHROOT_LOCKED:-}" = "$dir" ]; then
    stale=$(chroot_mounts_under "$dir")
    if [ -n "$stale" ]; then
      log "unmounting what an earlier run left mounted in $dir: ${stale//$'\n'/ }"
      chroot_unmount_under "$dir"
    fi
  fi
  mount -t proc proc "$dir/proc" && CHROOT_MOUNTS+=("$dir/proc")
  mount --bind /dev "$dir/dev" && CHROOT_MOUNTS+=("$dir/dev")
  # before anything is mounted below it: /dev is shared on a systemd host, and a mount on a
  # peer of it (dev/pts, dev/shm) would appear on the host's /dev too
  mount --make-private "$dir/dev" || log "mount --make-private $dir/dev failed"
  mount --bind /dev/pts "$dir/dev/pts" && CHROOT_MOUNTS+=("$dir/dev/pts")
  mount -t tmpfs -o mode=1777 shm "$dir/dev/shm" && CHROOT_MOUNTS+=("$dir/dev/shm")
}
# chroot_bind DIR SOURCE TARGET [ro]: a host directory inside the chroot, while it runs
chroot_bind() {
  mkdir -p "$1$3"
  mount --bind "$2" "$1$3" && CHROOT_MOUNTS+=("$1$3") || return 1
  mount --make-private "$1$3"
  [ "${4:-}" = ro ] && mount -o remount,bind,ro "$1$3"
  return 0
}
chroot_umount() {
  local i
  for ((i = ${#CHROOT_MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${CHROOT_MOUNTS[$i]}" 2>/dev/null || umount -l "${CHROOT_MOUNTS[$i]}" ||
      log "cannot unmount ${CHROOT_MOUNTS[$i]}"
  done
  CHROOT_MOUNTS=()
}

# chroot_mounts_under DIR: the mount points at or below DIR in this mount namespace, the last
# mounted first (the order that undoes them: a mount stacked on another, or on a parent, comes
# before it), one a line.
chroot_mounts_under() {
  awk -v d="$1" '{ p = $5; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print NR "\t" p }' \
    /proc/self/mountinfo | sort -k1,1nr | cut -f2-
}
# chroot_unmount_under DIR: unmounts all of them (lazily when busy); says what it could not.
chroot_unmount_under() {
  local mp left
  while IFS= read -r mp; do
    umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null
  done < <(chroot_mounts_under "$1")
  left=$(chroot_mounts_under "$1")
  [ -z "$left" ] || log "cannot unmount: ${left//$'\n'/ }"
}
# chroot_processes DIR: the processes whose root is DIR (pid and command line, one a line).
chroot_processes() {
  local p
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$1" ] &&
      printf '%s %s\n' "${p#/proc/}" "$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | cut -c1-80)"
  done
}

# with_chroot_lock MAJOR COMMAND...: COMMAND (a function or program) holding the chroot's lock,
# which every use of the chroot takes (one run at a time; and chroot_mount may then clean up).
with_chroot_lock() {
  local dir; dir=$(chroot_dir_of "$1") || return 1; shift
  mkdir -p "$IDEMPO_CACHE/chroots"
  ( flock 9; CHROOT_LOCKED=$dir; "$@" ) 9>"$dir.lock"
}

# chroot_leftovers MAJOR: after every run has ended, what is still mounted at or below the
# major's chroot, or still running in it; prints them, undoes them and fails if there was any
# (not when another process holds the chroot's lock: it is in use, not left behind).
chroot_leftovers() {
  local dir; dir=$(chroot_dir_of "$1") || return 0
  [ -d "$dir" ] || return 0
  (
    flock -n 9 || exit 0
    CHROOT_LOCKED=$dir
    mounts=$(chroot_mounts_under "$dir"); procs=$(chroot_processes "$dir")
    [ -z "$mounts$procs" ] && exit 0
    [ -n "$procs" ] && echo "left running: $(printf '%s\n' "$procs" | paste -sd ';' -)"
    [ -n "$mounts" ] && echo "left mounted: ${mounts//$'\n'/ }"
    # shellcheck disable=SC2046  # a list of pids: one argument each
    [ -n "$procs" ] && { kill $(printf '%s\n' "$procs" | cut -d' ' -f1) 2>/dev/null; sleep 2
                          # shellcheck disable=SC2046  # the same
                          kill -9 $(chroot_processes "$dir" | cut -d' ' -f1) 2>/dev/null; }
    chroot_unmount_under "$dir"
    exit 1
  ) 9>"$dir.lock"
}

# chroot_run MAJOR COMMAND...: runs COMMAND in the major's chroot (mounted: chroot_mount) with
# a clean environment; NAME=VALUE arguments before the command pass variables through.
# The chroot's lock (fd 9 of with_chroot_lock and run_major_in_chroot) stays outside: a process
# that outlives its run there (the run's shells killed with SIGKILL, a server left running)
# would otherwise hold the lock, so that chroot_leftovers took the chroot for in use and passed,
# and the next run waited for that process.
chroot_run() {
  local dir; dir=$(chroot_dir_of "$1"); shift
  chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" 9>&-
}

# in_chroot MAJOR COMMAND...: chroot_run with the mounts made for it and undone after (in a
# subshell of its own, whose EXIT trap undoes them however it ends).
in_chroot() {
  local m=$1; shift
  (
    # shellcheck disable=SC2030  # this subshell's own mounts, undone by its own EXIT trap
    CHROOT_MOUNTS=()
    trap chroot_umount EXIT
    chroot_mount "$(chroot_dir_of "$m")"
    chroot_run "$m" "$@"
  )
}

# The Citus source tarballs (never part of this repository): $IDEMPO_VENDOR_DIR, else
# shared/vendor beside the clone or one of its parent directories, else /work/shared/vendor.
# Prints the directory; fails if none has a SHA256SUMS.
find_vendor_dir() {
  local d
  if [ -n "${IDEMPO_VENDOR_DIR:-}" ]; then
    [ -f "$IDEMPO_VENDOR_DIR/SHA256SUMS" ] && { echo "$IDEMPO_VENDOR_DIR"; return 0; }
    return 1
  fi
  d=$(cd "$ROOT/.." && pwd)
  while :; do
    [ -f "$d/shared/vendor/SHA256SUMS" ] && { echo "$d/shared/vendor"; return 0; }
    [ "$d" = / ] && break
    d=$(dirname "$d")
  done
  [ -f /work/shared/vendor/SHA256SUMS ] && { echo /work/shared/vendor; return 0; }
  return 1
}

# Variables a developer may set that the run inside a chroot sees too.
PASS_THROUGH_VARS="TESTS SKIPS SHOW_LINES KEEP_WORKDIR FUZZ_SECONDS CHAOS_ORDERS API_FUZZ_CALLS PROVE_FLAGS CI CITUS_PORT EXPORTER_PORT UPGRADE_PORT HA_PG_PORT HA_REST_PORT HA_ETCD_PORT"

# run_major_in_chroot MAJOR RESULTS: test/run for MAJOR in its chroot, on a copy of this tree
# (the clone may be unreadable there), one run per chroot at a time; RESULTS gets its rows.
run_major_in_chroot() {
  local m=$1 results=$2 dir
  dir=$(chroot_dir_of "$m")
  mkdir -p "$IDEMPO_CACHE/chroots" "$IDEMPO_CACHE/citus"
  (
    flock 9
    CHROOT_LOCKED=$dir src=
    # set before any mount: whatever ends this subshell undoes them, and leaves nothing running
    trap 'chroot_end_run "$dir" "$results"; [ -n "$src" ] && rm -rf "$src"' EXIT
    if ! ensure_chroot "$m"; then
      printf 'server\t0\t1\t0\tcould not build the %s chroot (see %s)\n' "$(debian_release_of "$m")" \
        "$IDEMPO_CACHE/chroots" >"$results"
      exit 1
    fi
    src=$(mktemp -d "$dir/tmp/idempo-src.XXXXXX") || exit 1
    tar -C "$ROOT" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' --exclude=results \
      --exclude=node_modules -cf - . | tar -C "$src" -xf - || exit 1
    # the copy has no .git: the previous release's sources, for the package upgrade suite
    "$ROOT/test/packaging/run" export-history "$src/.idempo-history" >/dev/null 2>&1
    env_args=(PG_MAJOR="$m" IDEMPO_ONE_MAJOR=1 IDEMPO_RESULTS="${src#"$dir"}/results.tsv"
              IDEMPO_COMMIT="$(git -c safe.directory='*' -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)")
    # pg_upgrade from the previous supported major: its server in this chroot too
    if old=$(previous_major "$m"); then
      if why=$(prepare_old_major "$old" "$m"); then env_args+=(IDEMPO_UPGRADE_FROM="$old")
      else env_args+=(IDEMPO_UPGRADE_FROM="$old" IDEMPO_UPGRADE_FROM_ERROR="$why"); fi
    fi
    chroot_mount "$dir"
    if vendor=$(find_vendor_dir); then
      chroot_bind "$dir" "$vendor" /mnt/idempo-vendor ro && env_args+=(IDEMPO_VENDOR_DIR=/mnt/idempo-vendor)
    else
      env_args+=(IDEMPO_VENDOR_DIR=/nonexistent)
    fi
    chroot_bind "$dir" "$IDEMPO_CACHE/citus" /var/cache/idempo/citus
    for v in $PASS_THROUGH_VARS; do [ -n "${!v+x}" ] && env_args+=("$v=${!v}"); done
    chroot_run "$m" "${env_args[@]}" bash "${src#"$dir"}/test/run"
    rc=$?
    cp "$src/results.tsv" "$results" 2>/dev/null
    exit $rc
  ) 9>"$dir.lock"
}

# chroot_end_run DIR RESULTS: the end of a run in the chroot DIR (its EXIT trap): a process the
# run left in the chroot is stopped (TERM, then KILL) and a mount it made there undone, each
# recorded in RESULTS as a failure (suite chroot-leftovers), then the run's own mounts go.
chroot_end_run() {
  local dir=$1 results=$2 procs mounts own mp left=
  procs=$(chroot_processes "$dir")
  if [ -n "$procs" ]; then
    # shellcheck disable=SC2046  # a list of pids: one argument each
    kill $(printf '%s\n' "$procs" | cut -d' ' -f1) 2>/dev/null; sleep 2
    # shellcheck disable=SC2046  # the same
    kill -9 $(chroot_processes "$dir" | cut -d' ' -f1) 2>/dev/null
    left="left running (stopped): $(printf '%s\n' "$procs" | paste -sd ';' -)"
  fi
  # shellcheck disable=SC2031  # the mounts of the run's subshell, which calls this in its EXIT trap
  own=" ${CHROOT_MOUNTS[*]} "; mounts=
  while IFS= read -r mp; do [[ $own == *" $mp "* ]] || mounts+=" $mp"; done < <(chroot_mounts_under "$dir")
  [ -n "$mounts" ] && left="${left:+$left; }left mounted (unmounted):$mounts"
  chroot_umount
  chroot_unmount_under "$dir"
  if [ -n "$left" ]; then
    log "the run in $dir $left"
    printf 'chroot-leftovers\t0\t1\t0\t%s\n' "$left" >>"$results"
  fi
}

# The supported major before MAJOR (the one pg_upgrade to MAJOR is tested from); fails for the oldest.
previous_major() {
  local m prev=
  for m in $SUPPORTED_MAJORS; do [ "$m" = "$1" ] && break; prev=$m; done
  [ -n "$prev" ] && echo "$prev"
}

# prepare_old_major OLD NEW: OLD's server, client and headers in NEW's chroot, for pg_upgrade.
# They are Debian's own packages of OLD (downloaded by OLD's release: the host's apt or OLD's
# chroot), unpacked into NEW's chroot under OLD's versioned paths, which no package of NEW's
# release owns; the shared libraries they need that NEW's release no longer has (older sonames:
# ICU, LDAP, ...) are copied from OLD's release.  JIT is left out (it would need an old LLVM).
# Done once per chroot (a stamp file); prints a reason and fails if the old binaries do not run.
prepare_old_major() {
  local old=$1 new=$2 newdir olddir stamp dl f so path missing
  newdir=$(chroot_dir_of "$new"); stamp=$newdir/usr/lib/postgresql/$old/.idempo-old-major
  [ -f "$stamp" ] && return 0
  local pkgs=("postgresql-$old" "postgresql-client-$old" "postgresql-server-dev-$old")
  if major_is_native "$old"; then
    olddir=
    dl=$(mktemp -d "${TMPDIR:-/tmp}/idempo-old-debs.XXXXXX") || return 1
    (cd "$dl" && { apt-get download -q "${pkgs[@]}" || { apt-get update -qq && apt-get download -q "${pkgs[@]}"; }; } >/dev/null 2>&1) \
      || { echo "apt-get download ${pkgs[*]} failed"; return 1; }
  else
    olddir=$(chroot_dir_of "$old")
    [ -f "$olddir/.idempo-chroot" ] || with_chroot_lock "$old" ensure_chroot "$old" >&2 ||
      { echo "no chroot for PostgreSQL $old"; return 1; }
    dl=$(mktemp -d "$olddir/tmp/idempo-old-debs.XXXXXX") || return 1
    # the packages the old chroot installed are in its apt archive (no need to enter it, which
    # a run there may be using); else download them there
    for f in "${pkgs[@]}"; do cp "$olddir/var/cache/apt/archives/${f}_"*.deb "$dl/" 2>/dev/null || break; done
    [ "$(find "$dl" -name '*.deb' | wc -l)" -eq 3 ] ||
    with_chroot_lock "$old" in_chroot "$old" bash -c "cd '${dl#"$olddir"}' && { apt-get download -q ${pkgs[*]} || { apt-get update -qq && apt-get download -q ${pkgs[*]}; }; }" >/dev/null 2>&1 \
      || { echo "apt-get download ${pkgs[*]} failed in the $(debian_release_of "$old") chroot"; return 1; }
  fi
  for f in "$dl"/*.deb; do dpkg-deb -x "$f" "$newdir" || { echo "cannot unpack $f"; return 1; }; done
  rm -rf "$dl"
  rm -rf "$newdir/usr/lib/postgresql/$old/lib/llvmjit"* "$newdir/usr/lib/postgresql/$old/lib/bitcode"
  for _ in 1 2 3 4 5; do
    missing=$(chroot "$newdir" sh -c "ldd /usr/lib/postgresql/$old/bin/* /usr/lib/postgresql/$old/lib/*.so 2>/dev/null" \
              | awk '/not found/ { print $1 }' | sort -u)
    [ -z "$missing" ] && break
    for so in $missing; do
      path=$(chroot "${olddir:-/}" /sbin/ldconfig -p | awk -v s="$so" '$1 == s && /x86-64/ { print $NF; exit }')
      [ -n "$path" ] || { echo "PostgreSQL $old needs $so, which its own release does not have either"; return 1; }
      cp -L "$olddir$path" "$newdir/usr/lib/x86_64-linux-gnu/$so" || return 1
      log "PostgreSQL $old in the $(debian_release_of "$new") chroot: $so copied from $(debian_release_of "$old")"
    done
  done
  [ -z "$missing" ] || { echo "PostgreSQL $old still lacks: $missing"; return 1; }
  chroot "$newdir" "/usr/lib/postgresql/$old/bin/postgres" --version >/dev/null 2>&1 \
    || { echo "PostgreSQL $old's postgres does not run in the $(debian_release_of "$new") chroot"; return 1; }
  date -u +%FT%TZ >"$stamp"
}

# prepare_chroot_majors MAJOR...: for every major that runs in a chroot, what its run needs and
# a fresh machine lacks -- the chroot, the previous major's server beside it -- one chroot at a
# time under its lock (test/run does this while the host's major runs).
prepare_chroot_majors() {
  local m old dir why
  for m in "$@"; do
    major_is_native "$m" && continue
    debian_release_of "$m" >/dev/null || continue
    dir=$(chroot_dir_of "$m"); mkdir -p "$IDEMPO_CACHE/chroots"
    (
      flock 9
      CHROOT_LOCKED=$dir
      ensure_chroot "$m" || exit 1
      if old=$(previous_major "$m"); then
        why=$(prepare_old_major "$old" "$m") || log "PostgreSQL $old beside $m: $why"
      fi
      exit 0
    ) 9>"$dir.lock"
  done
}
