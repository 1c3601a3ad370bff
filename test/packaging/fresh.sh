#!/bin/bash
# Runs INSIDE a fresh environment of the release (a pristine minbase copy, see test/packaging/run):
# installs the server and idempo's package with apt the way a user does, and checks them.  Prints
# one line per check, "ok ..." or "FAILED ...", and exits non-zero after a failure.
#   fresh.sh install MAJOR             the package, no build tools, its autopkgtests
#   fresh.sh upgrade MAJOR OLD NEW     OLD's package with records in it, then NEW's over it
#   fresh.sh apt MAJOR VERSION SUITE   apt-get install postgresql-MAJOR-idempo from the signed
#                                      repository repo/ (test/release/run), as a user adds one
# Its payload is beside it: debs/ (the packages), src/ (the source tree: debian/tests run in it);
# for apt: repo/ (the repository, its key in repo/idempo-archive-keyring.asc), stranger.asc (a key
# that did not sign it).
set -u
mode=$1 M=$2
HERE=$(cd "$(dirname "$0")" && pwd)
export DEBIAN_FRONTEND=noninteractive
FAILED=0
ok() { echo "ok      $*"; }
failed() { echo "FAILED  $*"; FAILED=1; }
step() { echo "-- ${SECONDS}s: $*" >&2; }
# a server left running would keep the environment busy: stop it however this ends
trap 'pg_ctlcluster "$M" main stop -m immediate >/dev/null 2>&1' EXIT

# apt-get install, after an apt-get update if the lists (kept in the pristine copy) are stale
apt_install() {
  apt-get install -y -q "$@" >"$HERE/apt.log" 2>&1 && return 0
  step "apt-get install failed with the kept lists; apt-get update and again"
  apt-get update -q >>"$HERE/apt.log" 2>&1 && apt-get install -y -q "$@" >>"$HERE/apt.log" 2>&1 && return 0
  tail -20 "$HERE/apt.log" >&2
  return 1
}
# The server under test came from a suite apt does not prefer (APT_TARGET, e.g. experimental, and
# the environment that built the package had no pin for it): pin the server's packages to it, as
# a user does (apt-get -t would take every package it has, e.g. a newer perl, from there too).
if [ -n "${APT_TARGET:-}" ]; then
  # (500, as test/lib/servers.sh's apt_pin_of: the newer build of the two suites wins)
  printf 'Package: postgresql-%s postgresql-%s-* postgresql-*-%s libpq5 libpq-dev libpq-oauth\nPin: release a=%s\nPin-Priority: 500\n' \
    "$M" "$M" "$M" "$APT_TARGET" >/etc/apt/preferences.d/idempo-server
fi
deb_of() { local f; for f in "$HERE"/debs/postgresql-"$M"-idempo_"$1"_*.deb; do [ -e "$f" ] && echo "$f"; return 0; done; }

# The main cluster Debian's postgresql-M made when it was installed, as a user would set it up
# for idempo (docs: README's install section), on a Unix socket only (this environment shares
# the machine's network).
start_main() {
  printf '%s\n' "listen_addresses = ''" "shared_preload_libraries = 'idempo'" "max_worker_processes = 32" \
    "fsync = off" "idempo.worker_enabled = ${1:-on}" >"/etc/postgresql/$M/main/conf.d/idempo.conf" &&
  pg_ctlcluster "$M" main start
}
psqlm() { runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 --cluster "$M/main" "$@"; }

# workers_running DB: the launcher and DB's sweeper run (waits up to 30 s)
workers_running() {
  local got
  for _ in $(seq 60); do
    got=$(psqlm -d "$1" -At -c "
      SELECT count(*) FILTER (WHERE kind = 'launcher' AND pid > 0) || ' '
          || count(*) FILTER (WHERE kind = 'sweeper' AND d.datname = current_database()
                              AND state IN ('idle', 'sweeping'))
      FROM idempo.workers() w LEFT JOIN pg_database d ON d.oid = w.database_id" 2>&1)
    [ "$got" = "1 1" ] && return 0
    sleep 0.5
  done
  psqlm -d "$1" -c "SELECT * FROM idempo.workers()" >&2
  return 1
}

# test_depends TEST: what debian/tests/control says TEST needs besides the package (@), one
# package per line, each alternative resolved to the first one apt knows here
test_depends() {
  local dep alt name
  awk -v t="$1" 'BEGIN { RS = ""; FS = "\n" }
    { tests = ""; deps = ""; in_deps = 0
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^Tests:/) { tests = $i; sub(/^Tests: */, "", tests); in_deps = 0 }
        else if ($i ~ /^Depends:/) { in_deps = 1; d = $i; sub(/^Depends: */, "", d); deps = deps " " d }
        else if ($i ~ /^[ \t]/ && in_deps) deps = deps " " $i
        else in_deps = 0 }
      if (tests == t) print deps }' "$HERE/src/debian/tests/control" | tr ',' '\n' |
  while IFS= read -r dep; do
    dep=$(echo "$dep" | sed 's/([^)]*)//g; s/^ *//; s/ *$//')
    [ -z "$dep" ] || [ "$dep" = @ ] && continue
    IFS='|' read -ra alts <<<"$dep"
    for alt in "${alts[@]}"; do
      name=$(echo "$alt" | tr -d ' ')
      apt-cache show --no-all-versions "$name" >/dev/null 2>&1 && { echo "$name"; break; }
    done
  done
}

# run_test TEST LOG: debian/tests/TEST as autopkgtest runs it: in the source tree with
# AUTOPKGTEST_TMP set, as root only when its stanza in debian/tests/control has "needs-root",
# else as an unprivileged user that owns the tree (as autopkgtest makes it).  The throwaway
# cluster pg_virtualenv makes listens on localhost at the first free port from 5432, and the
# majors' runs share the host's network: two picking 5432 at the same moment made one fail to
# bind.  Each major's tests get a port of their own (PGPORT, which pg_virtualenv passes to
# pg_createcluster).
run_test() {
  local t=$1 log=$2 tmp=$HERE/tmp/$1 restr
  restr=$(awk -v t="$t" 'BEGIN { RS = ""; FS = "\n" }
    { tests = ""; r = ""
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^Tests:/) { tests = $i; sub(/^Tests: */, "", tests) }
        else if ($i ~ /^Restrictions:/) { r = $i; sub(/^Restrictions: */, "", r) } }
      if (tests == t) print r }' "$HERE/src/debian/tests/control")
  mkdir -p "$tmp"
  if [[ $restr == *needs-root* ]]; then
    (cd "$HERE/src" && PGPORT=$((64000 + M)) AUTOPKGTEST_TMP=$tmp "debian/tests/$t") >"$log" 2>&1
  else
    id autopkgtest-user >/dev/null 2>&1 || useradd -m autopkgtest-user
    chown -R autopkgtest-user "$HERE/src" "$tmp"
    (cd "$HERE/src" && runuser -u autopkgtest-user -- env PGPORT=$((64000 + M)) AUTOPKGTEST_TMP="$tmp" "debian/tests/$t") >"$log" 2>&1
  fi
}

# show_failure LOG: what a failed autopkgtest printed of its diffs ("**** FILE ****" and the
# file, after the server log pg_buildext prints), else the end of its log
show_failure() {
  if grep -q '^\*\*\*\* ' "$1"; then
    sed -n '/^\*\*\*\* /,$p' "$1" | head -300 >&2
  else
    tail -60 "$1" >&2
  fi
}

no_build_tools() {
  local found=() more=() t
  for t in gcc cc c99 clang make; do command -v "$t" >/dev/null && found+=("$t"); done
  mapfile -t more < <(dpkg-query -W -f='${db:Status-Status} ${Package}\n' 2>/dev/null |
            awk '$1 == "installed" && $2 ~ /^(gcc|gcc-[0-9]+|cpp|clang(-[0-9]+)?|make|postgresql-server-dev-.*|libpq-dev|libc6-dev)$/ { print $2 }')
  found+=("${more[@]}")
  [ -e "/usr/include/postgresql/$M/server/postgres.h" ] && found+=(server-headers)
  if [ ${#found[@]} -eq 0 ]; then ok "no build tools here: no gcc, cc, clang, make, libc6-dev, server headers"
  else failed "build tools present: ${found[*]}"; fi
}

case $mode in
install)
  deb=$(deb_of "$3")
  step "apt-get install postgresql-$M $(basename "$deb")"
  if apt_install "postgresql-$M" "$deb"; then
    ok "apt-get install postgresql-$M and $(basename "$deb") (Depends: $(dpkg-query -W -f='${Depends}' "postgresql-$M-idempo"))"
  else
    failed "apt-get install postgresql-$M $(basename "$deb")"; exit 1
  fi
  no_build_tools
  if start_main; then ok "cluster $M/main starts with shared_preload_libraries = idempo"
  else failed "cluster $M/main does not start"; tail -20 /var/log/postgresql/*.log; exit 1; fi
  runuser -u postgres -- createdb --cluster "$M/main" app
  v=$(psqlm -d app -At -c "CREATE EXTENSION idempo" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempo'" 2>&1)
  if [ "$v" = "${3%-*}" ]; then ok "CREATE EXTENSION idempo: version $v"; else failed "CREATE EXTENSION idempo: $v"; fi
  r=$(psqlm -d app -At -c "SELECT name FROM idempo.create_scope('pkg')" \
        -c "SELECT (idempo.claim('pkg', 'k', '{\"a\": 1}', complete_on_commit => true)).outcome" \
        -c "SELECT (idempo.claim('pkg', 'k', '{\"a\": 1}')).outcome" 2>&1 | paste -sd' ')
  if [ "$r" = "pkg acquired replay" ]; then ok "claim then replay"; else failed "claim then replay: $r"; fi
  if workers_running app; then ok "the launcher and app's sweeper run (idempo.workers())"
  else failed "the launcher and app's sweeper are not running"; fi
  psqlm -d app -c "SELECT backend_type, datname FROM pg_stat_activity WHERE backend_type LIKE 'idempo%' ORDER BY 1" >&2
  pg_ctlcluster "$M" main stop
  # autopkgtest: what debian/tests/control lists, each as autopkgtest runs it (run_test); first
  # the one that needs nothing but the package
  step "debian/tests/installed"
  if run_test installed "$HERE/installed.log"; then
    ok "autopkgtest installed: $(grep -cE '^(ok|not ok) |\.\.\. (ok|FAILED)' "$HERE/installed.log") regression and isolation tests, CREATE EXTENSION, workers, without build tools"
  else
    show_failure "$HERE/installed.log"
    failed "autopkgtest installed (log above)"
  fi
  grep -E 'tests passed|tests failed|^# All|^# [0-9]+ of|failed|worker:' "$HERE/installed.log" >&2
  # its dependencies (make, the server headers) come only now: the checks above ran without them
  mapfile -t dep_list < <(test_depends installcheck)
  deps=${dep_list[*]}
  step "apt-get install $deps (debian/tests/control: installcheck)"
  if [ -z "$deps" ] || ! apt_install "${dep_list[@]}"; then
    failed "could not install the installcheck test's dependencies"
  else
    step "debian/tests/installcheck"
    if run_test installcheck "$HERE/installcheck.log"; then
      ok "autopkgtest installcheck: pg_buildext installcheck ($(grep -cE '^(ok|not ok) |\.\.\. (ok|FAILED)' "$HERE/installcheck.log") regression and isolation tests)"
    else
      show_failure "$HERE/installcheck.log"
      failed "autopkgtest installcheck (log above)"
    fi
  fi
  ;;

apt)
  version=$3 suite=$4 list=/etc/apt/sources.list.d/idempo.list
  # signed by a key apt was not told to trust: apt must not install from it
  cp "$HERE/stranger.asc" /usr/share/keyrings/idempo-stranger.asc
  echo "deb [signed-by=/usr/share/keyrings/idempo-stranger.asc] file:$HERE/repo $suite main" >"$list"
  apt-get update -q >"$HERE/apt-stranger.log" 2>&1
  cand=$(apt-cache policy "postgresql-$M-idempo" | sed -n 's/^ *Candidate: //p')
  if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
    ok "a repository signed by another key than the one it is given: apt refuses it ($(grep -m1 -oE 'NO_PUBKEY|is not signed|BADSIG' "$HERE/apt-stranger.log"))"
  else
    failed "apt took postgresql-$M-idempo $cand from a repository it has no key for"
  fi
  # as a user adds a vendor's repository: its key in /usr/share/keyrings, signed-by in the list
  cp "$HERE/repo/idempo-archive-keyring.asc" /usr/share/keyrings/idempo-archive-keyring.asc
  printf '%s [signed-by=/usr/share/keyrings/idempo-archive-keyring.asc] file:%s %s main\n' deb "$HERE/repo" "$suite" \
    deb-src "$HERE/repo" "$suite" >"$list"
  step "apt-get update; apt-get install postgresql-$M-idempo"
  if apt-get update -q >"$HERE/apt-update.log" 2>&1 && ! grep -qE '^(W|E): ' "$HERE/apt-update.log"; then
    ok "apt-get update: the repository's InRelease verifies with its key"
  else
    tail -10 "$HERE/apt-update.log" >&2; failed "apt-get update with the repository's key"
  fi
  if apt_install "postgresql-$M-idempo" && [ "$(dpkg-query -W -f='${Version}' "postgresql-$M-idempo")" = "$version" ]; then
    ok "apt-get install postgresql-$M-idempo: $version from the repository (and postgresql-$M from Debian)"
  else
    failed "apt-get install postgresql-$M-idempo from the repository"; exit 1
  fi
  if (mkdir -p /tmp/source && cd /tmp/source && apt-get source --download-only -q idempo >"$HERE/apt-source.log" 2>&1 &&
      [ -f "idempo_$version.dsc" ]); then
    ok "apt-get source idempo: the source package from the repository"
  else
    tail -5 "$HERE/apt-source.log" >&2; failed "apt-get source idempo"
  fi
  no_build_tools
  if start_main; then ok "cluster $M/main starts with shared_preload_libraries = idempo"
  else failed "cluster $M/main does not start"; tail -20 /var/log/postgresql/*.log; exit 1; fi
  runuser -u postgres -- createdb --cluster "$M/main" app
  r=$(psqlm -d app -At -c "CREATE EXTENSION idempo" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempo'" \
        -c "SELECT name FROM idempo.create_scope('pkg')" \
        -c "SELECT (idempo.claim('pkg', 'k', '{\"a\": 1}', complete_on_commit => true)).outcome" \
        -c "SELECT (idempo.claim('pkg', 'k', '{\"a\": 1}')).outcome" \
        -c "SELECT (idempo.claim('pkg', 'k', '{\"a\": 2}')).outcome" 2>&1 | paste -sd' ')
  if [ "$r" = "${version%-*} pkg acquired replay conflict" ]; then ok "CREATE EXTENSION idempo ${version%-*}: claim, replay, conflict"
  else failed "CREATE EXTENSION, claim, replay, conflict: $r"; fi
  if workers_running app; then ok "the launcher and app's sweeper run (idempo.workers())"
  else failed "the launcher and app's sweeper are not running"; fi
  pg_ctlcluster "$M" main stop
  ;;

upgrade)
  old=$3 new=$4
  olddeb=$(deb_of "$old") newdeb=$(deb_of "$new")
  step "apt-get install postgresql-$M $(basename "$olddeb")"
  if apt_install "postgresql-$M" "$olddeb"; then ok "apt-get install postgresql-$M and $(basename "$olddeb")"
  else failed "apt-get install $(basename "$olddeb")"; exit 1; fi
  no_build_tools
  # the worker stays off until the update is done: nothing may change rows between the digests
  start_main off || { failed "cluster $M/main does not start with $old"; tail -20 /var/log/postgresql/*.log; exit 1; }
  runuser -u postgres -- createdb --cluster "$M/main" shop
  cp "$HERE"/src/test/upgrade/fill.sql "$HERE"/src/test/upgrade/digest_query.sql "$HERE"/src/test/upgrade/row_change.sql /tmp/ &&
    chmod 644 /tmp/*.sql
  v=$(psqlm -d shop -At -c "CREATE EXTENSION idempo" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempo'" 2>&1)
  if [ "$v" = "${old%-*}" ] && psqlm -d shop -f /tmp/fill.sql >/dev/null; then
    ok "$old: CREATE EXTENSION idempo (version $v), records stored through the API (test/upgrade/fill.sql)"
  else
    failed "$old: CREATE EXTENSION or fill: $v"; exit 1
  fi
  # a digest of every row, in the columns the old version has (test/upgrade/digest_query.sql)
  psqlm -d shop -At -f /tmp/digest_query.sql >/tmp/digest.sql
  before=$(psqlm -d shop -At -f /tmp/digest.sql)
  # an update to a newer version changes rows only as test/upgrade/row_change.sql does (made and
  # rolled back here); from an earlier revision of the same version nothing is updated
  if [ "${old%-*}" = "${new%-*}" ]; then want=$before
  else want=$(cat <(echo "BEGIN;") /tmp/row_change.sql /tmp/digest.sql <(echo "ROLLBACK;") | psqlm -d shop -At); fi
  step "apt-get install $(basename "$newdeb") over $old"
  if apt_install "$newdeb" && [ "$(dpkg-query -W -f='${Version}' "postgresql-$M-idempo")" = "$new" ]; then
    ok "apt-get install $(basename "$newdeb") upgrades $old to $new"
  else
    failed "apt-get install $(basename "$newdeb") over $old"; exit 1
  fi
  pg_ctlcluster "$M" main restart || { failed "restart after the upgrade"; exit 1; }
  # (quiet: from an earlier revision of the same version there is nothing to update)
  v=$(psqlm -d shop -At -c "SET client_min_messages = warning" -c "ALTER EXTENSION idempo UPDATE" \
        -c "SELECT extversion FROM pg_extension WHERE extname = 'idempo'" 2>&1)
  if [ "$v" = "${new%-*}" ]; then ok "restart, ALTER EXTENSION idempo UPDATE: version $v"
  else failed "ALTER EXTENSION idempo UPDATE: $v"; fi
  after=$(psqlm -d shop -At -f /tmp/digest.sql)
  if [ -n "$before" ] && [ "$want" = "$after" ]; then
    ok "every record kept ($(printf '%s\n' "$after" | awk '$1 != "sequence" && $1 != "scopes" { printf "%s%s %s", sep, $1, $2; sep = ", " }'))"
  else
    diff <(printf '%s\n' "$want") <(printf '%s\n' "$after") >&2
    failed "records changed by the package upgrade (beyond test/upgrade/row_change.sql; diff above: want, got)"
  fi
  psqlm -d shop -c "ALTER SYSTEM SET idempo.worker_enabled = on" -c "SELECT pg_reload_conf()" >/dev/null
  if workers_running shop; then ok "the launcher and shop's sweeper run after the upgrade"
  else failed "no launcher and sweeper after the upgrade"; fi
  r=$(psqlm -d shop -At -c "SELECT (idempo.claim('dump', 'k1', '{\"i\": 1}')).outcome" \
        -c "SELECT (idempo.claim('dump', 'k1', '{\"i\": 2}')).outcome" -c "SELECT count(*) FROM idempo.check_consistency()" 2>&1 | paste -sd' ')
  if [ "$r" = "replay conflict 0" ]; then ok "old records answer: replay, conflict; consistent"
  else failed "after the upgrade: '$r' (want 'replay conflict 0')"; fi
  pg_ctlcluster "$M" main stop
  ;;
esac
exit $FAILED
