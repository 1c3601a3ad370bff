/*-------------------------------------------------------------------------
 *
 * init.c
 *	  Module load: settings (GUCs) and backend callbacks.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "miscadmin.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	DefineCustomIntVariable("idempo.clock_offset",
							"Shifts idempo's clock by this many seconds (for tests).",
							"Lets tests evaluate lease, retention and settle decisions at a later "
							"time without waiting. Leave it at 0 in production.",
							&idempo_clock_offset_s,
							0, -1000000000, 1000000000,
							PGC_SUSET,
							GUC_UNIT_S | GUC_NOT_IN_SAMPLE,
							NULL, NULL, NULL);
	MarkGUCPrefixReserved("idempo");

	idempo_catalog_register_callbacks();
	idempo_txn_register_callbacks();
}
