/*-------------------------------------------------------------------------
 *
 * lookup.c
 *	  idempo.lookup(scope, key): the record of an operation, or NULL.
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
	Datum		args[2];
	Datum		row = (Datum) 0;
	bool		isnull = true;

	idempo_spi_begin(&session);
	scope = idempo_scope_get(scope_name);
	args[0] = CStringGetTextDatum(scope->name);
	args[1] = CStringGetTextDatum(idempo_key_arg(fcinfo, 1, scope));
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
