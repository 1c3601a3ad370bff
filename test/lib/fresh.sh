# shellcheck shell=bash
# A fresh environment of this Debian release, the way a user's new machine is: a debootstrap
# --variant=minbase made once and kept as a tarball under $FRESH_CACHE (default
# $IDEMPO_CACHE/packaging; with the apt sources of this environment: a chroot's extra suites,
# e.g. experimental, come along), extracted anew for each use, entered in a mount namespace of its
# own; the packages apt downloads there are kept in $FRESH_ARCHIVES (default beside the tarball).
# Used by test/packaging/run (the .deb installed with apt) and test/release/run (apt install from
# the release's signed repository).  Sourced after common.sh, for PG_MAJOR; the caller defines
# pass, fail (its counts) and WORK (its work directory, on the file system of $FRESH_ARCHIVES:
# the downloaded packages are hard-linked: FRESH_WORK_ROOT is where to make it, by default
# $FRESH_CACHE).  Defines functions and the variables below.

# Unmounts whatever is still mounted under DIR (deepest first), then removes DIR without ever
# crossing into another file system.
remove_tree() {
  local dir=$1 m
  [ -d "$dir" ] || return 0
  while IFS= read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done < <(awk -v d="$dir/" 'index($2 "/", d) == 1 { print $2 }' /proc/mounts 2>/dev/null | sort -r)
  rm -rf --one-file-system "$dir"
}

# This environment's release: the suite of its first deb line (a debootstrap chroot's
# sources.list), else the host's codename.  Extra suites come with the copied apt sources.
base_suite() {
  local s
  s=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $(i + 1); exit } }' /etc/apt/sources.list 2>/dev/null)
  echo "${s:-$(host_release)}"
}
# The suite the server under test came from, when apt would not take it by default (e.g.
# experimental, priority 1, without a pin): the fresh environment pins the server's packages to it.
apt_target() {
  apt-cache policy "postgresql-$PG_MAJOR" 2>/dev/null | awk '
    / \*\*\* / { mine = 1; next }
    mine && $2 ~ /:\/\// { if ($1 < 500) { split($3, s, "/"); print s[1] }; exit }
    mine && $2 !~ /^\// { exit }'
}
FRESH_CACHE=${FRESH_CACHE:-$IDEMPO_CACHE/packaging}
APT_TARGET=$(apt_target)
FRESH_KEY=$(debian_release_of "$PG_MAJOR" 2>/dev/null || echo "$(base_suite)-pg$PG_MAJOR")
PRISTINE=$FRESH_CACHE/$FRESH_KEY.minbase.tar
FRESH_ARCHIVES=${FRESH_ARCHIVES:-$FRESH_CACHE/$FRESH_KEY.archives}
FRESH_WORK_ROOT=${FRESH_WORK_ROOT:-$FRESH_CACHE}

# Made once (under $FRESH_CACHE/KEY.lock: two runs on one machine make it once): debootstrap
# --variant=minbase, this environment's apt sources, apt's lists.
ensure_pristine() {
  local new=$WORK/pristine f
  [ -s "$PRISTINE" ] && return 0
  log "making the pristine $FRESH_KEY environment (once per machine): debootstrap --variant=minbase $(base_suite)"
  debootstrap --variant=minbase "$(base_suite)" "$new" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; return 1; }
  # the apt sources of this environment (e.g. a chroot's experimental), not its other apt settings
  rm -f "$new/etc/apt/sources.list"
  [ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$new/etc/apt/"
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources /etc/apt/preferences.d/*; do
    [ -f "$f" ] && cp "$f" "$new${f%/*}/"
  done
  # as test/lib/servers.sh's chroots: no recommends; a snapshot mirror's Release may be past its
  # Valid-Until; keep what apt downloads (this suite keeps it beside the tarball)
  printf '%s\n' 'APT::Install-Recommends "false";' 'Dpkg::Options { "--force-unsafe-io"; };' \
    'Acquire::Check-Valid-Until "false";' 'APT::Keep-Downloaded-Packages "true";' \
    'Acquire::Languages "none";' >"$new/etc/apt/apt.conf.d/90idempo"
  rm -f "$new"/etc/apt/apt.conf.d/docker-clean
  # packages must not start services (there is no init here)
  printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"; chmod 755 "$new/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$new/etc/resolv.conf" 2>/dev/null
  chroot "$new" apt-get update -q >"$WORK/pristine-update.log" 2>&1 \
    || { tail -20 "$WORK/pristine-update.log" >&2; return 1; }
  rm -f "$new"/var/cache/apt/archives/*.deb
  tar -C "$new" -cf "$PRISTINE.new" . && mv "$PRISTINE.new" "$PRISTINE"
  remove_tree "$new"
}
# with_pristine: ensure_pristine under the lock, or a failure counted
with_pristine() {
  mkdir -p "$FRESH_CACHE"
  (flock 8; ensure_pristine) 8>"$FRESH_CACHE/$FRESH_KEY.lock" && return 0
  fail "could not make the pristine $FRESH_KEY environment (debootstrap)"
  return 1
}

# in_fresh NAME PAYLOAD ARGS...: a new copy of the pristine environment with the directory
# PAYLOAD's contents in /pkgtest, where /pkgtest/fresh.sh ARGS runs as root (test/packaging/
# fresh.sh, or a copy); its "ok ..." and "FAILED ..." lines are counted (pass, fail).
in_fresh() {
  local name=$1 payload=$2 env=$WORK/env-$1 rc line f; shift 2
  remove_tree "$env"; mkdir -p "$env"
  tar -C "$env" -xf "$PRISTINE" || { fail "extracting $PRISTINE"; return 1; }
  cp /etc/resolv.conf "$env/etc/resolv.conf" 2>/dev/null
  # this environment's apt preferences as they are now (the pristine copy keeps those of the day
  # it was made: e.g. test/lib/servers.sh's pin of experimental, since changed)
  for f in /etc/apt/preferences.d/*; do [ -f "$f" ] && cp "$f" "$env/etc/apt/preferences.d/"; done
  mkdir -p "$FRESH_ARCHIVES" "$env/pkgtest" "$env/dev/shm"
  find "$FRESH_ARCHIVES" -name '*.deb' -exec cp -l {} "$env/var/cache/apt/archives/" \; 2>/dev/null
  cp -a "$payload/." "$env/pkgtest/" || { fail "copying $payload"; return 1; }
  chmod -R a+rX "$env/pkgtest"
  # a mount namespace of its own: its /proc and /dev/shm go away with it, whatever happens
  # (remove_tree unmounts them too where mounts propagate back, on a host with shared mounts)
  # shellcheck disable=SC2016  # the script in single quotes is bash -c's: its variables expand there
  APT_TARGET=$APT_TARGET unshare --mount --propagation unchanged -- bash -c '
    env=$1; shift
    mount -t proc proc "$env/proc" && mount -t tmpfs -o mode=1777 shm "$env/dev/shm" || exit 1
    chroot "$env" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      APT_TARGET="$APT_TARGET" bash /pkgtest/fresh.sh "$@"
    rc=$?
    umount "$env/dev/shm" "$env/proc" 2>/dev/null
    exit $rc' _ "$env" "$@" >"$WORK/fresh-$name.out" 2>"$WORK/fresh-$name.err"
  rc=$?
  cat "$WORK/fresh-$name.err" >&2
  while IFS= read -r line; do
    case "$line" in
      "ok "*) line=${line#ok }; pass "${line#"${line%%[! ]*}"}" ;;
      "FAILED "*) line=${line#FAILED }; fail "${line#"${line%%[! ]*}"}" ;;
      *) log "$line" ;;
    esac
  done <"$WORK/fresh-$name.out"
  [ "$rc" -eq 0 ] || grep -q '^FAILED' "$WORK/fresh-$name.out" || fail "the fresh environment's run ended with exit $rc"
  # keep what apt downloaded for the next run (same file system: hard links)
  find "$env/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -exec cp -l -n {} "$FRESH_ARCHIVES/" \; 2>/dev/null
  [ "${KEEP_WORKDIR:-0}" = 1 ] || remove_tree "$env"
}
