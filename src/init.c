/*-------------------------------------------------------------------------
 *
 * init.c
 *	  Module load.  Everything but the worker and the shared counters works
 *	  when the library is loaded on demand by CREATE EXTENSION or a call;
 *	  with shared_preload_libraries = 'idempo' the postmaster also gets the
 *	  shared memory, the launcher and the utility hook.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "miscadmin.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	idempo_define_gucs();
	idempo_catalog_register_callbacks();
	idempo_scope_cache_register_callbacks();
	idempo_txn_register_callbacks();
	/* the drop guard's backstop: also when loaded on demand (drop_guard.c) */
	idempo_install_drop_hook();

	if (!process_shared_preload_libraries_in_progress)
		return;

	/* pg_upgrade starts the server only to move catalogs: no worker, no hooks */
	if (IsBinaryUpgrade)
		return;

	idempo_shmem_install_hooks();
	idempo_install_utility_hook();
	idempo_register_launcher_worker();
}
