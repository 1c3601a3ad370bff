/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *	  idempo.fingerprint(jsonb): SHA-256 of the canonical encoding of a
 *	  request's parameters, and the SHA-256 helper used for hashed keys.
 *
 * The jsonb iterator hands us the document in a normalized shape already:
 * whitespace is gone and object keys are unique and sorted (by length, then
 * bytes).  What is left to normalize is numeric scale, done by
 * canon_number() on numeric_out's text.  Hashing streams through
 * pg_cryptohash, so even a large document needs no buffer of its size.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "canonical.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/numeric.h"

PG_FUNCTION_INFO_V1(idempo_fingerprint);

static void
sha256_sink(void *arg, const uint8_t *data, size_t len)
{
	if (pg_cryptohash_update((pg_cryptohash_ctx *) arg, data, len) < 0)
		elog(ERROR, "could not update SHA-256 context: %s",
			 pg_cryptohash_error((pg_cryptohash_ctx *) arg));
}

static pg_cryptohash_ctx *
sha256_begin(void)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (ctx == NULL || pg_cryptohash_init(ctx) < 0)
		elog(ERROR, "could not initialize SHA-256 context");
	return ctx;
}

static void
sha256_end(pg_cryptohash_ctx *ctx, uint8 *digest_out)
{
	if (pg_cryptohash_final(ctx, digest_out, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not finalize SHA-256 context: %s", pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
}

void
idempo_sha256(const uint8 *data, size_t len, uint8 *digest_out)
{
	pg_cryptohash_ctx *ctx = sha256_begin();

	sha256_sink(ctx, data, len);
	sha256_end(ctx, digest_out);
}

static void
write_scalar(CanonWriter *w, JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			canon_null(w);
			break;
		case jbvBool:
			canon_bool(w, v->val.boolean);
			break;
		case jbvString:
			canon_string(w, v->val.string.val, v->val.string.len);
			break;
		case jbvNumeric:
			{
				char	   *text = numeric_normalize(v->val.numeric);

				if (canon_number(w, text, strlen(text)) != 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("cannot fingerprint the number \"%s\"", text),
							 errhint("Only finite numbers can appear in params.")));
				pfree(text);
				break;
			}
		default:
			elog(ERROR, "unexpected jsonb value type %d", (int) v->type);
	}
}

/* SHA-256 of the canonical encoding of a jsonb document. */
void
idempo_fingerprint_jsonb(Jsonb *jb, uint8 *digest_out)
{
	pg_cryptohash_ctx *ctx = sha256_begin();
	CanonWriter w = {sha256_sink, ctx};
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbValue	v;
	JsonbIteratorToken tok;
	uint32		n = 0;

	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if ((++n & 0xFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		switch (tok)
		{
			case WJB_BEGIN_ARRAY:
				/* a top-level scalar comes wrapped in a one-element "raw scalar" array */
				if (!v.val.array.rawScalar)
					canon_array(&w, (uint32) v.val.array.nElems);
				break;
			case WJB_BEGIN_OBJECT:
				canon_object(&w, (uint32) v.val.object.nPairs);
				break;
			case WJB_KEY:
				canon_string(&w, v.val.string.val, v.val.string.len);
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				write_scalar(&w, &v);
				break;
			case WJB_END_ARRAY:
			case WJB_END_OBJECT:
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d", (int) tok);
		}
	}
	sha256_end(ctx, digest_out);
}

/* idempo.fingerprint(params jsonb) RETURNS bytea */
Datum
idempo_fingerprint(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	bytea	   *result = palloc(VARHDRSZ + IDEMPO_DIGEST_LEN);

	SET_VARSIZE(result, VARHDRSZ + IDEMPO_DIGEST_LEN);
	idempo_fingerprint_jsonb(jb, (uint8 *) VARDATA(result));
	PG_RETURN_BYTEA_P(result);
}
