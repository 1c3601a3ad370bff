/*-------------------------------------------------------------------------
 *
 * lookup.c
 *	  idempo.lookup(scope, key): the record of an operation, or NULL.
 *
 * The record holds the stored result, so a scope's allowed_role gates this
 * read like the writes: one application cannot read another's results.  A
 * disabled scope can still be looked at.  Reviewers see records through the
 * reader functions (reviewable_operations_of(), review_queue_page(), ...),
 * not this call.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(idempo_lookup);

Datum
idempo_lookup(PG_FUNCTION_ARGS)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	IdempoSpiSession session;
	const IdempoScope *scope;
	char	   *key;
	Datum		args[2];
	Datum		row = (Datum) 0;
	bool		isnull = true;

	idempo_spi_begin(&session);
	scope = idempo_scope_get(scope_name);
	key = idempo_key_arg(fcinfo, 1, scope);
	/* allowed_role keeps other roles out of the stored results, as out of the writes */
	idempo_scope_check_read(scope, key, session.save_userid);
	args[0] = CStringGetTextDatum(scope->name);
	args[1] = CStringGetTextDatum(key);
	if (idempo_spi_execute(PLAN_OP_LOOKUP, args, NULL, 1) == 1)
	{
		row = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull)
			row = SPI_datumTransfer(row, false, -1);
	}
	idempo_spi_end(&session);
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(row);
}
