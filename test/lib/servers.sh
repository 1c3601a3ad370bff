# Where each supported PostgreSQL major's server comes from.  Sourced by test/run (after
# common.sh); defines functions only.
#
# Every major is Debian's own package of it, from the Debian release that ships it: the host's
# release runs natively, any other runs in a chroot of its release made with debootstrap and
# kept under $IDEMPO_CACHE/chroots/RELEASE, so that a second run reuses it.  The chroot shares
# the host's network (loopback); /proc, /dev, /dev/pts and /dev/shm are mounted while a command
# runs in it.  Nothing here touches the host's apt configuration.

SUPPORTED_MAJORS="15 17 18"
IDEMPO_CACHE=${IDEMPO_CACHE:-/var/cache/idempo}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# The Debian release that packages a major (18: the development distribution).
debian_release_of() {
  case "$1" in
    15) echo bookworm ;;
    17) echo trixie ;;
    18) echo sid ;;
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
    libkrb5-dev libzstd-dev liblz4-dev libicu-dev libcurl4-openssl-dev
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
    rm -rf "$new"
    debootstrap --variant=minbase "$rel" "$new" "$DEBIAN_MIRROR" >"$IDEMPO_CACHE/chroots/$rel.debootstrap.log" 2>&1 \
      || { tail -20 "$IDEMPO_CACHE/chroots/$rel.debootstrap.log" >&2; return 1; }
    # packages must not start services, and the server package must not create a cluster
    printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"; chmod 755 "$new/usr/sbin/policy-rc.d"
    mkdir -p "$new/etc/postgresql-common"
    echo "create_main_cluster = false" >"$new/etc/postgresql-common/createcluster.conf"
    echo "$rel, debootstrap $(date -u +%FT%TZ)" >"$new/.idempo-chroot"
    mv "$new" "$dir"
  fi
  cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null
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
  # shellcheck disable=SC2046
  in_chroot "$m" bash -c '
    missing=(); for p in "$@"; do
      dpkg-query -W -f="\${Status}" "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && exit 0
    echo "installing in the chroot: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null' \
    _ $(chroot_base_packages "$m")
}

# Mounts what a process in the chroot needs; chroot_umount undoes it (also after a failure).
CHROOT_MOUNTS=()
chroot_mount() {
  local dir=$1
  mount -t proc proc "$dir/proc" && CHROOT_MOUNTS+=("$dir/proc")
  mount --bind /dev "$dir/dev" && CHROOT_MOUNTS+=("$dir/dev")
  mount --make-private "$dir/dev" 2>/dev/null
  mount --bind /dev/pts "$dir/dev/pts" && CHROOT_MOUNTS+=("$dir/dev/pts")
  mount -t tmpfs -o mode=1777 shm "$dir/dev/shm" && CHROOT_MOUNTS+=("$dir/dev/shm")
}
# chroot_bind DIR SOURCE TARGET [ro]: a host directory inside the chroot, while it runs
chroot_bind() {
  mkdir -p "$1$3"
  mount --bind "$2" "$1$3" && CHROOT_MOUNTS+=("$1$3") || return 1
  [ "${4:-}" = ro ] && mount -o remount,bind,ro "$1$3"
  return 0
}
chroot_umount() {
  local i
  for ((i = ${#CHROOT_MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${CHROOT_MOUNTS[$i]}" 2>/dev/null || umount -l "${CHROOT_MOUNTS[$i]}" 2>/dev/null
  done
  CHROOT_MOUNTS=()
}

# chroot_run MAJOR COMMAND...: runs COMMAND in the major's chroot (mounted: chroot_mount) with
# a clean environment; NAME=VALUE arguments before the command pass variables through.
chroot_run() {
  local dir; dir=$(chroot_dir_of "$1"); shift
  chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# in_chroot MAJOR COMMAND...: chroot_run with the mounts made for it and undone after.
in_chroot() {
  local m=$1 rc; shift
  chroot_mount "$(chroot_dir_of "$m")"
  chroot_run "$m" "$@"; rc=$?
  chroot_umount
  return $rc
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
PASS_THROUGH_VARS="KEEP_WORKDIR FUZZ_SECONDS CHAOS_ORDERS API_FUZZ_CALLS PROVE_FLAGS CI CITUS_PORT EXPORTER_PORT UPGRADE_PORT"

# run_major_in_chroot MAJOR RESULTS: test/run for MAJOR in its chroot, on a copy of this tree
# (the clone may be unreadable there), one run per chroot at a time; RESULTS gets its rows.
run_major_in_chroot() {
  local m=$1 results=$2 dir
  dir=$(chroot_dir_of "$m")
  mkdir -p "$IDEMPO_CACHE/chroots" "$IDEMPO_CACHE/citus"
  (
    flock 9
    if ! ensure_chroot "$m"; then
      printf 'server\t0\t1\t0\tcould not build the %s chroot (see %s)\n' "$(debian_release_of "$m")" \
        "$IDEMPO_CACHE/chroots" >"$results"
      exit 1
    fi
    src=$(mktemp -d "$dir/tmp/idempo-src.XXXXXX") || exit 1
    trap 'chroot_umount; rm -rf "$src"' EXIT
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
  local old=$1 new=$2 newdir olddir stamp dl pkgs f so path missing round
  newdir=$(chroot_dir_of "$new"); stamp=$newdir/usr/lib/postgresql/$old/.idempo-old-major
  [ -f "$stamp" ] && return 0
  pkgs="postgresql-$old postgresql-client-$old postgresql-server-dev-$old"
  if major_is_native "$old"; then
    olddir=
    dl=$(mktemp -d "${TMPDIR:-/tmp}/idempo-old-debs.XXXXXX") || return 1
    (cd "$dl" && { apt-get download -q $pkgs || { apt-get update -qq && apt-get download -q $pkgs; }; } >/dev/null 2>&1) \
      || { echo "apt-get download $pkgs failed"; return 1; }
  else
    olddir=$(chroot_dir_of "$old")
    [ -f "$olddir/.idempo-chroot" ] || ensure_chroot "$old" >&2 || { echo "no chroot for PostgreSQL $old"; return 1; }
    dl=$(mktemp -d "$olddir/tmp/idempo-old-debs.XXXXXX") || return 1
    # the packages the old chroot installed are in its apt archive (no need to enter it, which
    # a run there may be using); else download them there
    for f in $pkgs; do cp "$olddir/var/cache/apt/archives/${f}_"*.deb "$dl/" 2>/dev/null || break; done
    [ "$(find "$dl" -name '*.deb' | wc -l)" -eq 3 ] ||
    (flock 8; in_chroot "$old" bash -c "cd '${dl#"$olddir"}' && { apt-get download -q $pkgs || { apt-get update -qq && apt-get download -q $pkgs; }; }" >/dev/null 2>&1) 8>"$olddir.lock" \
      || { echo "apt-get download $pkgs failed in the $(debian_release_of "$old") chroot"; return 1; }
  fi
  for f in "$dl"/*.deb; do dpkg-deb -x "$f" "$newdir" || { echo "cannot unpack $f"; return 1; }; done
  rm -rf "$dl"
  rm -rf "$newdir/usr/lib/postgresql/$old/lib/llvmjit"* "$newdir/usr/lib/postgresql/$old/lib/bitcode"
  for round in 1 2 3 4 5; do
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
      ensure_chroot "$m" || exit 1
      if old=$(previous_major "$m"); then
        why=$(prepare_old_major "$old" "$m") || log "PostgreSQL $old beside $m: $why"
      fi
      exit 0
    ) 9>"$dir.lock"
  done
}
