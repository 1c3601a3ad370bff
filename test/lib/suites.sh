# shellcheck shell=bash
# The suites of test/run that have no runner of their own: one function each, run by run_suite
# (test/run) with the run's cluster up (WORK: its socket directory and work area, PORT, and the
# tree's copy in $WORK/src that the cluster user can read).  Each prints what it did, may end
# with "N passed, N failed" (counts, for information) or "skipped: REASON", and returns non-zero
# when it failed: the return code is the verdict.  Sourced after common.sh; functions only.

# The installed-server targets of the Makefile, as the cluster user on the tree's copy, against
# the run's cluster.
make_as_pg() {
  (cd "$WORK" && as_pg env PGHOST="$WORK" PGPORT="$PORT" PGUSER=postgres PGOPTIONS="${PGOPTIONS:-}" \
     ${IDEMPO_OLD_INSTALL:+IDEMPO_OLD_INSTALL="$IDEMPO_OLD_INSTALL"} make -C "$WORK/src" PG_CONFIG="$PGBIN/pg_config" "$@")
}

# suite_installcheck regress|isolation DBNAME TEST...: make installcheck with only that kind's
# tests (pg_regress or pg_isolation_regress, the Makefile's options) in a database of its own.
suite_installcheck() {
  local kind=$1 db=$2 out rc vars ok bad f; shift 2
  if [ "$kind" = regress ]; then vars=(REGRESS="$*" ISOLATION= CONTRIB_TESTDB="$db")
  else vars=(REGRESS= ISOLATION="$*" ISOLATION_TESTDB="$db"); fi
  out=$(make_as_pg installcheck "${vars[@]}" 2>&1); rc=$?
  printf '%s\n' "$out"
  if [ "$rc" -ne 0 ]; then
    for f in "$WORK/src/results/regression.diffs" "$WORK/src/results/isolation/regression.diffs"; do
      [ -s "$f" ] && head -300 "$f"
    done
  fi
  # one line per test: "name ... ok" (15), "ok N - name" / "not ok N - name" (16 on, TAP)
  ok=$(printf '%s\n' "$out" | grep -cE '\.\.\. ok|^ok [0-9]+ ')
  bad=$(printf '%s\n' "$out" | grep -cE '\.\.\. (FAILED|failed)|^not ok [0-9]+ ')
  # exit 0 without one test counted: nothing ran (an empty list), or the output is not understood
  if [ "$rc" -eq 0 ] && [ $((ok + bad)) -eq 0 ]; then echo "no $kind test ran (tests: ${*:-none})"; return 1; fi
  printf '%d passed, %d failed\n' "$ok" "$bad"
  return "$rc"
}

# prove_counts OUTPUT: "N passed, N failed" from the summary of prove or pg_prove (test files):
# Files=N, and a failed file for each file of the "Test Summary Report" with a failed test, a
# non-zero exit or wait status or a parse error (a file there for a passed TODO only passed).
# (TAP::Harness 3 prints no "Failed N/M test programs" line: counting that one gave 0 failed.)
prove_counts() {
  printf '%s\n' "$1" | awk '
    /^Files=[0-9]+,/ { split($1, a, /[=,]/); files = a[2] }
    /^Test Summary Report/ { report = 1; next }
    report && /^[^ ].* \(Wstat: / { file = $0; next }
    report && file != "" && /^  (Failed tests?:|Non-zero (exit|wait) status:|Parse errors:)/ { bad[file] = 1 }
    END { n = 0; for (f in bad) n++; ok = files - n; printf "%d passed, %d failed\n", ok < 0 ? 0 : ok, n }'
}

# suite_pgtap FILE...: the pgTAP files (test/pgtap) with pg_prove in a database of their own.
suite_pgtap() {
  local out rc
  [ -z "$PGTAP_MISSING" ] || { echo "skipped: $PGTAP_MISSING"; return 0; }
  [ $# -gt 0 ] || { echo "0 passed, 0 failed"; return 0; }
  cpsql "$WORK" "$PORT" -c "DROP DATABASE IF EXISTS idempo_pgtap" -c "CREATE DATABASE idempo_pgtap" &&
    cpsql "$WORK" "$PORT" -d idempo_pgtap -c "CREATE EXTENSION pgtap" -c "CREATE EXTENSION idempo" || return 1
  out=$(cd "$WORK/src/test/pgtap" && as_pg pg_prove -h "$WORK" -p "$PORT" -U postgres -d idempo_pgtap \
        "${@/%/.sql}" 2>&1); rc=$?
  printf '%s\n' "$out"
  prove_counts "$out"
  return "$rc"
}

# suite_tap NAME...: the Perl TAP tests test/tap/t/NAME.pl with make prove_installcheck, as the cluster
# user (initdb refuses root); they start clusters of their own under the copy's tmp_check.
# IDEMPO_OLD_INSTALL in the environment: the previous major, for t/005_pg_upgrade.pl.
suite_tap() {
  local out rc f files=("${@/#/test/tap/t/}")
  [ $# -gt 0 ] || { echo "0 passed, 0 failed"; return 0; }
  out=$(make_as_pg prove_installcheck PROVE_TESTS="${files[*]/%/.pl}" PROVE_FLAGS="${PROVE_FLAGS:-}" 2>&1); rc=$?
  printf '%s\n' "$out"
  # PGXS's prove_installcheck only echoes "TAP tests not enabled" (exit 0) for a server built
  # without --enable-tap-tests: no "Result: PASS", no pass
  if [ "$rc" -eq 0 ] && ! printf '%s\n' "$out" | grep -q '^Result: PASS'; then
    echo "prove did not report 'Result: PASS'"; return 1
  fi
  if [ "$rc" -ne 0 ]; then
    for f in "$WORK"/src/tmp_check/log/*.log; do
      [ -f "$f" ] && { echo "---- $f"; tail -40 "$f"; }
    done
  fi
  prove_counts "$out"
  return "$rc"
}

# suite_pg_upgrade OLD: idempo built for the previous major OLD (whose server servers.sh put
# beside this one), then t/005_pg_upgrade.pl from OLD to this major.
suite_pg_upgrade() {
  local old=$1 old_build=$WORK/build-$1 out
  [ -z "${IDEMPO_UPGRADE_FROM_ERROR:-}" ] || { echo "$IDEMPO_UPGRADE_FROM_ERROR"; return 1; }
  mkdir -p "$old_build"
  tar -C "$ROOT" --exclude='*.o' --exclude='*.so' --exclude='*.bc' -cf - Makefile idempo.control src |
    tar -C "$old_build" -xf - || return 1
  if ! out=$(make -C "$old_build" -j2 PG_CONFIG="/usr/lib/postgresql/$old/bin/pg_config" with_llvm=no install 2>&1); then
    printf '%s\n' "$out" | tail -20
    echo "idempo did not build for PostgreSQL $old"
    return 1
  fi
  IDEMPO_OLD_INSTALL=/usr/lib/postgresql/$old suite_tap 005_pg_upgrade
}

# suite_fingerprint plain|ignore: idempo.fingerprint() against the independent implementation
# (test/fingerprint/check.py fails on any mismatch, or if it compared nothing).
suite_fingerprint() {
  cpsql "$WORK" "$PORT" -c "DROP DATABASE IF EXISTS idempo_reference_$1" -c "CREATE DATABASE idempo_reference_$1" &&
    (cd "$WORK" && as_pg python3 "$WORK/src/test/fingerprint/check.py" "$1" "$WORK" "$PORT" "idempo_reference_$1")
}

# Every idempo table and sequence survives pg_dump/pg_restore (pg_extension_config_dump).
# (the data: the upgrade test's fill, which uses only the oldest released API, and the rows of
# 0.3.0's features: test/dump/fill_0_3.sql)
suite_dump_restore() {
  local d=$WORK/src/test before after
  cpsql "$WORK" "$PORT" -c "DROP DATABASE IF EXISTS idempo_dump" -c "CREATE DATABASE idempo_dump" \
    -c "DROP DATABASE IF EXISTS idempo_restored" -c "CREATE DATABASE idempo_restored" &&
  cpsql "$WORK" "$PORT" -d idempo_dump -c "CREATE EXTENSION idempo" -f "$d/upgrade/fill.sql" \
    -f "$d/dump/fill_0_3.sql" >/dev/null &&
  (cd "$WORK" && as_pg "$PGBIN/pg_dump" -h "$WORK" -p "$PORT" -U postgres -Fc -f "$WORK/out/idempo.dump" idempo_dump) &&
  (cd "$WORK" && as_pg "$PGBIN/pg_restore" -h "$WORK" -p "$PORT" -U postgres -d idempo_restored --exit-on-error "$WORK/out/idempo.dump") ||
    return 1
  before=$(cpsql "$WORK" "$PORT" -d idempo_dump -At -f "$d/dump/digest.sql")
  after=$(cpsql "$WORK" "$PORT" -d idempo_restored -At -f "$d/dump/digest.sql")
  printf '%s\n' "$before"
  [ -n "$before" ] && [ "$before" = "$after" ] && return 0
  diff <(echo "$before") <(echo "$after")
  return 1
}

# 2 x API_FUZZ_CALLS random and hostile calls of the whole SQL API in two concurrent sessions:
# every call succeeds or fails with a documented SQLSTATE, and the tables stay consistent.  55P03
# is documented for claim (wait => false meeting alter_scope's table lock) and alter_scope only.
suite_api_fuzz() {
  local calls=${API_FUZZ_CALLS:-50000} s verdict
  local undocumented="sqlstate NOT IN ('00000', '22004', '22023', '42501', '42704', '42710', '55000', '40001', '40P01')
                      AND NOT (sqlstate = '55P03' AND fn IN ('claim', 'alter_scope'))"
  cpsql "$WORK" "$PORT" -c "DROP DATABASE IF EXISTS idempo_apifuzz" -c "CREATE DATABASE idempo_apifuzz" &&
    cpsql "$WORK" "$PORT" -d idempo_apifuzz -f "$WORK/src/test/security/api_fuzz.sql" >/dev/null || return 1
  for s in 1 2; do
    cpsql "$WORK" "$PORT" -d idempo_apifuzz -c "CALL fuzz.run($calls)" >"$WORK/out/api_fuzz.$s.log" 2>&1 &
  done
  wait
  cpsql "$WORK" "$PORT" -d idempo_apifuzz -c "SELECT sqlstate, sum(calls) AS calls FROM fuzz.outcomes GROUP BY 1 ORDER BY 1"
  cpsql "$WORK" "$PORT" -d idempo_apifuzz -c "SELECT fn, sqlstate, calls, message FROM fuzz.outcomes WHERE $undocumented"
  verdict=$(cpsql "$WORK" "$PORT" -d idempo_apifuzz -At -c "
    SELECT sum(calls) || ' calls, '
        || coalesce(sum(calls) FILTER (WHERE $undocumented), 0) || ' undocumented errors, '
        || (SELECT count(*) FROM idempo.check_consistency()) || ' consistency problems'
    FROM fuzz.outcomes")
  echo "api fuzz: $verdict"
  [ "$verdict" = "$((2 * calls)) calls, 0 undocumented errors, 0 consistency problems" ]
}

# The clear key of a hash_keys scope reaches no table and no log line, even through errors.
suite_hashed_keys() {
  cpsql "$WORK" "$PORT" -c "DROP DATABASE IF EXISTS idempo_hashed" -c "CREATE DATABASE idempo_hashed" &&
    (cd "$WORK" && as_pg python3 "$WORK/src/test/security/hashed_keys.py" "$WORK" "$PORT" idempo_hashed "$WORK/server.log")
}

# The benchmark scripts still work (asserts nothing about speed): test/bench/NAME --short.
suite_bench() { "$ROOT/test/bench/$1" --short; }

# The server survived everything before it.
suite_server_log() {
  ! grep -E 'terminated by signal|server process .* was terminated' "$WORK/server.log"
}
