# shellcheck shell=bash
# Citus for the major under test, built from the vendored source tarball (never from this
# repository) and cached per (PostgreSQL major, Citus version) under $IDEMPO_CACHE/citus, so
# that a machine builds each once.  Sourced after common.sh; defines functions only.

CITUS_RECIPE=2

# The Citus release that supports each major (13.x is the last line for 15; 14.x is 16-18).
citus_version_for() {
  case "$1" in
    15) echo 13.2.2 ;;
    16|17|18) echo 14.0.1 ;;
    *) return 1 ;;
  esac
}

# ensure_citus: installs Citus into the server under test unless that version is there.
# Prints the reason (one line) on stdout and returns 1 when Citus cannot be had here (no source
# tarball: the caller skips), 2 when it can but did not build or install (a failure).
ensure_citus() {
  local ver vendor tarball stage cached build sharedir curl_opt
  ver=$(citus_version_for "$PG_MAJOR") || { echo "no Citus release supports PostgreSQL $PG_MAJOR yet (Citus 14.0.1 supports 16 to 18)"; return 1; }
  sharedir=$("$PGBIN/pg_config" --sharedir)
  # the build steps below are recipe $CITUS_RECIPE: a change of them makes a new cache entry
  cached=$IDEMPO_CACHE/citus/pg$PG_MAJOR-citus-$ver-r$CITUS_RECIPE.tar.gz
  if [ "$(cat "$sharedir/extension/citus.idempo-build" 2>/dev/null)" = "${cached##*/}" ] &&
     [ -f "$("$PGBIN/pg_config" --pkglibdir)/citus.so" ]; then
    return 0
  fi
  if [ ! -s "$cached" ]; then
    vendor=$(find_vendor_dir) || { echo "no Citus source tarballs (IDEMPO_VENDOR_DIR, shared/vendor beside the clone, /work/shared/vendor)"; return 1; }
    tarball=$vendor/citus-$ver.tar.gz
    [ -f "$tarball" ] || { echo "$tarball is missing"; return 1; }
    (cd "$vendor" && grep " citus-$ver.tar.gz\$" SHA256SUMS | sha256sum --quiet -c -) >/dev/null 2>&1 \
      || { echo "$tarball does not match $vendor/SHA256SUMS"; return 2; }
    ensure_packages "${CORE_PACKAGES[@]}" libkrb5-dev libzstd-dev liblz4-dev libicu-dev libcurl4-openssl-dev
    build=$(mktemp -d "${TMPDIR:-/tmp}/idempo-citus-build.XXXXXX") || return 2
    log "building Citus $ver for PostgreSQL $PG_MAJOR from $tarball (once per machine; log: $build/build.log)"
    tar -C "$build" -xzf "$tarball" || { echo "cannot unpack $tarball"; return 2; }
    # Citus 13.2.2 defines its own have_createdb_privilege() for servers before 17, which the
    # headers of later 15.x releases also declare: rename Citus's copy (in this build tree only).
    if grep -qs '^have_createdb_privilege(void)' "$build/citus-$ver/src/include/pg_version_compat.h" &&
       grep -qs 'have_createdb_privilege' "$("$PGBIN/pg_config" --includedir-server)/commands/dbcommands.h"; then
      grep -rl --include='*.[ch]' 'have_createdb_privilege' "$build/citus-$ver/src" \
        | xargs -r sed -i 's/\bhave_createdb_privilege\b/citus_have_createdb_privilege/g'
    fi
    # without libcurl where the server allows (no usage reports; test/citus/run also switches
    # them off): a server built with libcurl (18) defines HAVE_LIBCURL for Citus's sources too,
    # which then need it.  Unoptimized: the tests need Citus's behaviour, not its speed, and it
    # compiles in half the time.
    curl_opt=--without-libcurl
    grep -qs '^#define HAVE_LIBCURL 1' "$("$PGBIN/pg_config" --includedir-server)/pg_config.h" && curl_opt=
    stage=$build/stage
    # the system's pg_config: the cached tree holds /usr/... paths, extracted below under
    # IDEMPO_PG_PREFIX when the suite runs against a private copy (test/lib/common.sh)
    (cd "$build/citus-$ver" && { ./configure PG_CONFIG="/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" ${curl_opt:+"$curl_opt"} &&
            make -j2 COPT='-O0 -g0' && make install DESTDIR="$stage"; } >"$build/build.log" 2>&1) \
      || { tail -30 "$build/build.log" >&2; echo "building Citus $ver failed (log: $build/build.log)"; return 2; }
    mkdir -p "$IDEMPO_CACHE/citus"
    { tar -C "$stage" -czf "$cached.tmp" . && mv "$cached.tmp" "$cached"; } || { echo "cannot write $cached"; return 2; }
    rm -rf "$build"
  fi
  tar -C "${IDEMPO_PG_PREFIX:-/}" -xzf "$cached" || { echo "cannot install $cached"; return 2; }
  echo "${cached##*/}" >"$sharedir/extension/citus.idempo-build"
  log "Citus $ver installed for PostgreSQL $PG_MAJOR (from $cached)"
}
