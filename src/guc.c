/*-------------------------------------------------------------------------
 *
 * guc.c
 *	  idempo's settings.  All live under the reserved prefix "idempo.".
 *
 *	  idempo.databases       which databases the worker serves ('' = every
 *	                         database that allows connections and has the
 *	                         extension); sighup
 *	  idempo.sweep_interval  pause between sweep rounds; sighup
 *	  idempo.sweep_batch     rows per sweep transaction; sighup
 *	  idempo.worker_enabled  off stops all sweeping; sighup
 *	  idempo.clock_offset    shifts idempo's clock by an interval, for tests;
 *	                         superuser
 *	  idempo.direct_writes   off routes every write through SQL (for
 *	                         comparison and diagnosis); superuser
 *	  idempo.allow_drop_with_records  on lets DROP EXTENSION idempo delete
 *	                         records (drop_guard.c); superuser
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "utils/guc.h"
#include "utils/varlena.h"

char	   *idempo_databases = NULL;
int			idempo_sweep_interval_ms = 10000;
int			idempo_sweep_batch_size = 1000;
bool		idempo_worker_enabled = true;
bool		idempo_direct_writes = true;

static bool
check_databases(char **newval, void **extra, GucSource source)
{
	char	   *copy = pstrdup(*newval);
	List	   *names;
	bool		ok = SplitIdentifierString(copy, ',', &names);

	if (!ok)
		GUC_check_errdetail("List syntax is invalid: give database names separated by commas.");
	list_free(names);
	pfree(copy);
	return ok;
}

void
idempo_define_gucs(void)
{
	DefineCustomStringVariable("idempo.databases",
							   "Databases the idempo worker sweeps (empty: all with the extension).",
							   "A comma-separated list of database names. Empty means every database "
							   "that allows connections and has the idempo extension installed.",
							   &idempo_databases,
							   "",
							   PGC_SIGHUP, 0,
							   check_databases, NULL, NULL);
	DefineCustomIntVariable("idempo.sweep_interval",
							"Pause between two sweep rounds of the idempo worker.",
							"A round that handled a full batch is followed at once by another.",
							&idempo_sweep_interval_ms,
							10000, 100, 24 * 3600 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("idempo.sweep_batch",
							"Rows one sweep transaction handles at most.",
							"Smaller batches hold row locks for less time; larger ones sweep faster.",
							&idempo_sweep_batch_size,
							1000, 1, 100000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
	DefineCustomBoolVariable("idempo.worker_enabled",
							 "Whether the idempo worker sweeps.",
							 "Off leaves all sweeping to explicit calls of idempo.sweep().",
							 &idempo_worker_enabled,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);
	DefineCustomStringVariable("idempo.clock_offset",
							   "Shifts idempo's clock by this interval (for tests).",
							   "Lets tests evaluate lease, retention and settle decisions at a later "
							   "time without waiting: any interval, such as '6 minutes', '-2 hours' "
							   "or '90' (seconds). Leave it at 0 in production.",
							   &idempo_clock_offset,
							   "0",
							   PGC_SUSET, GUC_NOT_IN_SAMPLE,
							   idempo_clock_offset_check, idempo_clock_offset_assign, NULL);
	DefineCustomBoolVariable("idempo.direct_writes",
							 "Whether new records and their completion bypass the SQL executor.",
							 "On, a claim of a new key and the complete/fail of an attempt the same "
							 "transaction inserted use the table and index access methods directly. "
							 "Off runs them as SQL statements, like every other write. The results "
							 "are the same; only the cost differs.",
							 &idempo_direct_writes,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	DefineCustomBoolVariable("idempo.allow_drop_with_records",
							 "Lets DROP EXTENSION idempo delete operations, open reviews and open conflicts.",
							 "Off (the default), dropping the extension is refused while it holds them "
							 "(drop_guard.c).",
							 &idempo_allow_drop_with_records,
							 false,
							 PGC_SUSET, GUC_NOT_IN_SAMPLE,
							 NULL, NULL, NULL);
	MarkGUCPrefixReserved("idempo");
}

/* Whether idempo.databases lets the worker serve this database. */
bool
idempo_database_listed(const char *name)
{
	char	   *copy;
	List	   *names;
	ListCell   *lc;
	bool		listed = false;

	if (idempo_databases == NULL || idempo_databases[0] == '\0')
		return true;
	copy = pstrdup(idempo_databases);
	if (SplitIdentifierString(copy, ',', &names))
		foreach(lc, names)
			if (strcmp((char *) lfirst(lc), name) == 0)
				listed = true;
	list_free(names);
	pfree(copy);
	return listed;
}
