# idempo: PGXS build.  Everything is derived: the version from idempo.control,
# the objects from src/*.c, the regression tests from sql/*.sql.

EXTENSION    = idempo
EXTVERSION   = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)
MODULE_big   = idempo
OBJS         = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))
DATA         = $(sort $(wildcard src/sql/$(EXTENSION)--*.sql))
PGFILEDESC   = "idempo - the same business action happens once"

REGRESS      = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=. --outputdir=results
ISOLATION    = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=results/isolation
# pg_isolation_regress makes its --outputdir but not the parent: results/ must exist when the
# specs run without the regression tests (make installcheck REGRESS= ISOLATION=..., which is
# what test/run's isolation suite and TESTS=isolation:SPEC do on a tree without results/).
REGRESS_PREP = results-dir

PG_CPPFLAGS  = -I$(srcdir)/src
PG_CFLAGS    = -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare \
               -Wno-missing-field-initializers -Wno-cast-function-type

PG_CONFIG   ?= pg_config
PGXS        := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

EXTRA_CLEAN  = results

.PHONY: results-dir
results-dir:
	@mkdir -p results

# PGXS does not track header dependencies; every object depends on our headers.
$(OBJS): $(wildcard src/*.h)

# The Perl TAP tests (test/tap/t: workers, crashes with kill -9, standbys, pg_upgrade) against the
# installed server, as PGXS runs an extension's TAP tests; run it as a user other than root (initdb
# refuses root).  One file: make prove_installcheck PROVE_TESTS=test/tap/t/001_worker.pl
# (t/005_pg_upgrade.pl also needs IDEMPO_OLD_INSTALL, the previous major's installation.)
PROVE_TESTS ?= test/tap/t/*.pl
.PHONY: prove_installcheck
prove_installcheck: export IDEMPO_TEST_SRC = $(abspath $(srcdir))/test
prove_installcheck:
	$(prove_installcheck)

# The regression and isolation suites with every server process under Valgrind memcheck.
.PHONY: valgrind-check
valgrind-check:
	test/valgrind/run

# The managed-service edition (managed/README.md): the pg_tle installer and the plain SQL script,
# generated from src/sql/ and managed/sql/; the last two lines of output are their paths.
.PHONY: tle-installer
tle-installer:
	@python3 managed/generate.py build/managed

# The artifacts people install from (tools/release): `make release` builds them all into
# build/release with SHA256SUMS, the Debian packages of every supported major (those of other
# Debian releases in their chroots, as root: docs/packaging.md); `make dist`, the PGXN
# distribution alone (build/release/idempo-VERSION.zip).
.PHONY: dist release
dist:
	tools/release dist
release:
	tools/release
