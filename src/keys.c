/*-------------------------------------------------------------------------
 *
 * keys.c
 *	  Checks of the scope and key arguments, and the form a key is stored in.
 *
 * In hash_keys scopes only the SHA-256 digest of a key (lowercase hex) is
 * ever stored or printed: the clear key is hashed here, before anything
 * else sees it, and error messages name the digest.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "citus.h"

#include "mb/pg_wchar.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(idempo_stored_key);

void
idempo_hex_digest(const uint8 *data, size_t len, char *hex_out)
{
	static const char hexdigits[] = "0123456789abcdef";
	size_t		i;

	for (i = 0; i < len; i++)
	{
		hex_out[2 * i] = hexdigits[data[i] >> 4];
		hex_out[2 * i + 1] = hexdigits[data[i] & 0xF];
	}
	hex_out[2 * len] = '\0';
}

/*
 * A bytea argument as a message shows it: quoted text when it is short
 * printable UTF-8 (a run id passed by position, say), else hex.
 */
char *
idempo_bytea_arg_text(bytea *b)
{
	const char *data = VARDATA_ANY(b);
	int			len = VARSIZE_ANY_EXHDR(b);
	bool		printable = len > 0 && len <= 64 && pg_verify_mbstr(PG_UTF8, data, len, true);
	char	   *hex;
	int			i;

	for (i = 0; printable && i < len; i++)
		if ((unsigned char) data[i] < 0x20 || data[i] == 0x7f)
			printable = false;
	if (printable)
		return psprintf("'%.*s' (as text)", len, data);
	hex = palloc(2 * Min(len, 32) + 1);
	idempo_hex_digest((const uint8 *) data, Min(len, 32), hex);
	return psprintf("'\\x%s%s'", hex, len > 32 ? "..." : "");
}

/* True if the text is empty or only ASCII whitespace. */
static bool
blank(const text *t)
{
	const char *p = VARDATA_ANY(t);
	const char *end = p + VARSIZE_ANY_EXHDR(t);

	for (; p < end; p++)
		if (*p != ' ' && (*p < '\t' || *p > '\r'))	/* \t \n \v \f \r */
			return false;
	return true;
}

/* The scope argument as a C string; refuses NULL, blank and oversized names. */
char *
idempo_scope_arg(FunctionCallInfo fcinfo, int argno)
{
	text	   *t;
	size_t		len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("scope must not be NULL"),
				 errhint("Pass the scope name, e.g. 'warehouse.outbound'.")));
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (blank(t))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 len == 0 ? errmsg("scope must not be empty") : errmsg("scope must not be only whitespace"),
				 errhint("Pass the scope name, e.g. 'warehouse.outbound'.")));
	if (len > IDEMPO_MAX_SCOPE_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("scope name is %zu bytes long, the limit is %d", len, IDEMPO_MAX_SCOPE_BYTES),
				 errhint("No scope can have such a name; check the arguments' order.")));
	return text_to_cstring(t);
}

/*
 * The key argument in its stored form: the key itself, or the hex SHA-256
 * digest of it in hash_keys scopes.  Refuses NULL, blank (empty or only
 * whitespace) and oversized keys without quoting them.
 */
char *
idempo_key_arg(FunctionCallInfo fcinfo, int argno, const IdempoScope *scope)
{
	text	   *t;
	size_t		len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("key must not be NULL (scope \"%s\")", scope->name),
				 errhint("Pass the stable identity of the business action, e.g. 'order-1001/shipment-1'.")));
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (blank(t))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 len == 0 ? errmsg("key must not be empty (scope \"%s\")", scope->name) :
				 errmsg("key must not be only whitespace (scope \"%s\")", scope->name),
				 errhint("Pass the stable identity of the business action, e.g. 'order-1001/shipment-1'.")));
	if (len > IDEMPO_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key is %zu bytes long, the limit is %d (scope \"%s\")",
						len, IDEMPO_MAX_KEY_BYTES, scope->name),
				 errhint("Build keys from business identifiers, or pass a digest of a long one: encode(sha256(convert_to(key, 'UTF8')), 'hex').%s",
						 scope->hash_keys ? " The limit applies to the clear key in hash_keys scopes too." : "")));
	if (scope->hash_keys)
	{
		uint8		digest[IDEMPO_DIGEST_LEN];
		char	   *hex = palloc(IDEMPO_DIGEST_HEX_LEN + 1);

		/* Citus routes a delegated call by the key it is given, not by its digest */
		if (idempo_citus_distributed())
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("scope \"%s\" stores keys hashed (hash_keys), which idempo does not support on a Citus cluster",
							scope->name),
					 errhint("Pass a digest of the key yourself as the key, in a scope without hash_keys, and distribute the business table by it.")));

		idempo_sha256((const uint8 *) VARDATA_ANY(t), len, digest);
		idempo_hex_digest(digest, IDEMPO_DIGEST_LEN, hex);
		return hex;
	}
	return text_to_cstring(t);
}

/* idempo.stored_key(scope, key): the key as idempo stores it. */
Datum
idempo_stored_key(PG_FUNCTION_ARGS)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	MemoryContext callcxt = CurrentMemoryContext;
	IdempoSpiSession session;
	const IdempoScope *scope;
	char	   *key;

	idempo_spi_begin(&session);
	scope = idempo_scope_get(scope_name);
	/* SPI's memory goes away with the session */
	key = MemoryContextStrdup(callcxt, idempo_key_arg(fcinfo, 1, scope));
	idempo_spi_end(&session);
	PG_RETURN_TEXT_P(cstring_to_text(key));
}
