/*-------------------------------------------------------------------------
 *
 * fingerprint_rules.c
 *	  Fields left out of the fingerprint: a scope's fingerprint_ignore and
 *	  idempo.fingerprint(params, ignore).
 *
 * A path is a dot-separated list of object keys from the top of the
 * document ('delivered_at', 'meta.trace_id').  Arrays are not entered, and a
 * path that is absent (or runs into a scalar or an array) removes nothing.
 * The paths are compiled once into a small tree of key segments; applying
 * it copies the document without the named fields (only the objects on a
 * path are rebuilt, everything else is copied whole), and the copy is then
 * fingerprinted with the usual canonical encoding.  So an ignored field is
 * exactly as if it had not been sent.
 *
 * Limits, so that no input can exhaust memory or the stack: at most
 * IDEMPO_IGNORE_MAX_PATHS paths of at most IDEMPO_IGNORE_MAX_PATH_BYTES
 * bytes each.  Bad lists (NULL elements, empty paths or segments) are
 * refused with 22023; check_scope() refuses the same for scopes.  The
 * checks of a list that do not depend on the grammar of a path are
 * idempo_path_list(), which fingerprint_include.c's lists go through too.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

PG_FUNCTION_INFO_V1(idempo_fingerprint_ignoring);

/* the tree of the paths: IdempoPathNode (idempo.h), shared by both lists */
struct IdempoIgnore
{
	IdempoPathNode root;
};

/* The child of n reached by key (len bytes), or NULL. */
IdempoPathNode *
idempo_path_key(const IdempoPathNode *n, const char *key, int len)
{
	int			i;

	for (i = 0; i < n->nkeys; i++)
		if (n->keys[i]->keylen == len && memcmp(n->keys[i]->key, key, len) == 0)
			return n->keys[i];
	return NULL;
}

/* The child of n reached by key, added (in cxt) if there is none yet. */
IdempoPathNode *
idempo_path_add_key(MemoryContext cxt, IdempoPathNode *n, const char *key, int len)
{
	IdempoPathNode *c = idempo_path_key(n, key, len);

	if (c != NULL)
		return c;
	c = MemoryContextAllocZero(cxt, sizeof(IdempoPathNode));
	c->key = MemoryContextAlloc(cxt, len + 1);
	memcpy(c->key, key, len);
	c->key[len] = '\0';
	c->keylen = len;
	if (n->nkeys == 0)
		n->keys = MemoryContextAlloc(cxt, sizeof(IdempoPathNode *) * 4);
	else if ((n->nkeys & (n->nkeys - 1)) == 0 && n->nkeys >= 4)
		n->keys = repalloc(n->keys, sizeof(IdempoPathNode *) * n->nkeys * 2);
	n->keys[n->nkeys++] = c;
	return c;
}

/* Refuses one path of a list: for a scope (naming it) or for idempo.fingerprint(). */
void
idempo_path_refuse(const IdempoPathList *list, const char *scope, int index, const char *what,
				   const char *hint)
{
	if (scope != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fingerprint_%s of scope \"%s\": path %d %s", list->rule, scope, index, what),
				 errhint("%s", hint)));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("fingerprint %s path %d %s", list->rule, index, what),
			 errhint("%s", hint)));
}

/*
 * The paths of a list (fingerprint_ignore or fingerprint_include), each
 * checked against what both lists refuse: several dimensions, more than
 * IDEMPO_IGNORE_MAX_PATHS paths, a NULL, an empty path, a path over
 * IDEMPO_IGNORE_MAX_PATH_BYTES.  The grammar of a path is the caller's.
 * Returns the number of paths (0: none), *paths_out the paths.  scope names
 * the scope in errors (NULL: the caller is idempo.fingerprint()).
 */
int
idempo_path_list(ArrayType *paths, const IdempoPathList *list, const char *scope,
				 text ***paths_out)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;
	text	  **out;

	if (ARR_NDIM(paths) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 scope ? errmsg("fingerprint_%s of scope \"%s\" must be a one-dimensional array",
								list->rule, scope)
				 : errmsg("fingerprint %s paths must be a one-dimensional array", list->rule),
				 errhint("%s", list->example)));
	deconstruct_array(paths, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n > IDEMPO_IGNORE_MAX_PATHS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 scope ? errmsg("fingerprint_%s of scope \"%s\" has %d paths, the limit is %d",
								list->rule, scope, n, IDEMPO_IGNORE_MAX_PATHS)
				 : errmsg("%d fingerprint %s paths given, the limit is %d",
						  n, list->rule, IDEMPO_IGNORE_MAX_PATHS),
				 errhint("%s", list->many_hint)));
	out = palloc(sizeof(text *) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		int			len;

		if (nulls[i])
			idempo_path_refuse(list, scope, i + 1, "is NULL", "Remove the NULL element.");
		out[i] = DatumGetTextPP(elems[i]);
		len = VARSIZE_ANY_EXHDR(out[i]);
		if (len == 0)
			idempo_path_refuse(list, scope, i + 1, "is empty", list->empty_hint);
		if (len > IDEMPO_IGNORE_MAX_PATH_BYTES)
			idempo_path_refuse(list, scope, i + 1,
							   psprintf("is %d bytes long, the limit is %d", len, IDEMPO_IGNORE_MAX_PATH_BYTES),
							   "Use a shorter path.");
	}
	*paths_out = out;
	return n;
}

static const IdempoPathList ignore_list = {
	"ignore",
	"Pass e.g. ARRAY['delivered_at', 'meta.trace_id'].",
	"Name the few volatile fields (delivery times, attempt counters, trace ids); leave the object that holds many of them out as one path.",
	"A path names a field, e.g. 'delivered_at' or 'meta.trace_id'."
};

/*
 * Compiles a text[] of paths into a tree allocated in cxt; NULL when the
 * list is empty (nothing is ignored).  scope names the scope in errors
 * (NULL: the caller is idempo.fingerprint()).
 */
IdempoIgnore *
idempo_ignore_compile(ArrayType *paths, MemoryContext cxt, const char *scope)
{
	text	  **texts;
	int			n;
	int			i;
	IdempoIgnore *root;

	if (paths == NULL)
		return NULL;
	n = idempo_path_list(paths, &ignore_list, scope, &texts);
	if (n == 0)
		return NULL;

	root = MemoryContextAllocZero(cxt, sizeof(IdempoIgnore));
	for (i = 0; i < n; i++)
	{
		const char *p = VARDATA_ANY(texts[i]);
		int			len = VARSIZE_ANY_EXHDR(texts[i]);
		int			start = 0;
		int			pos;
		IdempoPathNode *node = &root->root;

		for (pos = 0; pos <= len; pos++)
		{
			if (pos < len && p[pos] != '.')
				continue;
			if (pos == start)
				idempo_path_refuse(&ignore_list, scope, i + 1,
								   psprintf("(\"%s\") has an empty segment", pnstrdup(p, len)),
								   "Separate object keys with single dots, without a dot at either end.");
			node = idempo_path_add_key(cxt, node, p + start, pos - start);
			start = pos + 1;
		}
		node->terminal = true;
	}
	return root;
}

static void push_pruned_object(JsonbInState *state, JsonbContainer *obj, const IdempoPathNode *node);

/* Pushes one value (a scalar or a container given as jbvBinary), pruned below node if an object. */
static void
push_value(JsonbInState *state, JsonbIteratorToken seq, JsonbValue *v, const IdempoPathNode *node)
{
	if (node != NULL && node->nkeys > 0 && v->type == jbvBinary &&
		JsonContainerIsObject(v->val.binary.data))
		push_pruned_object(state, v->val.binary.data, node);
	else
		pushJsonbValue(state, seq, v);
}

/*
 * Pushes an object without the fields node's children end on, entering the
 * ones they continue in (closing the outermost sets state->result).
 */
static void
push_pruned_object(JsonbInState *state, JsonbContainer *obj, const IdempoPathNode *node)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	const IdempoPathNode *child = NULL;
	bool		skip = false;

	check_stack_depth();
	CHECK_FOR_INTERRUPTS();
	it = JsonbIteratorInit(obj);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_OBJECT:
				pushJsonbValue(state, WJB_BEGIN_OBJECT, NULL);
				break;
			case WJB_END_OBJECT:
				pushJsonbValue(state, WJB_END_OBJECT, NULL);
				break;
			case WJB_KEY:
				child = idempo_path_key(node, v.val.string.val, v.val.string.len);
				skip = child != NULL && child->terminal;
				if (!skip)
					pushJsonbValue(state, WJB_KEY, &v);
				break;
			case WJB_VALUE:
				if (!skip)
					push_value(state, WJB_VALUE, &v, child);
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d in an object", (int) tok);
		}
	}
}

/* The document without the ignored fields (itself when nothing is to be left out). */
Jsonb *
idempo_ignore_apply(Jsonb *jb, const IdempoIgnore *ignore)
{
	JsonbInState state;

	if (ignore == NULL || !JB_ROOT_IS_OBJECT(jb))
		return jb;
	memset(&state, 0, sizeof(state));
	push_pruned_object(&state, &jb->root, &ignore->root);
	if (state.result == NULL)
		elog(ERROR, "pruning a jsonb object returned nothing");
	return JsonbValueToJsonb(state.result);
}

/* Fingerprint of params under a compiled ignore list. */
void
idempo_fingerprint_ignoring_jsonb(Jsonb *jb, const IdempoIgnore *ignore, uint8 *digest_out)
{
	idempo_fingerprint_jsonb(idempo_ignore_apply(jb, ignore), digest_out);
}

/* idempo.fingerprint(params jsonb, ignore text[]) RETURNS bytea; NULL ignore: nothing ignored */
Datum
idempo_fingerprint_ignoring(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb;
	IdempoIgnore *ignore;
	bytea	   *result;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	jb = PG_GETARG_JSONB_P(0);
	ignore = PG_ARGISNULL(1) ? NULL :
		idempo_ignore_compile(PG_GETARG_ARRAYTYPE_P(1), CurrentMemoryContext, NULL);
	result = palloc(VARHDRSZ + IDEMPO_DIGEST_LEN);
	SET_VARSIZE(result, VARHDRSZ + IDEMPO_DIGEST_LEN);
	idempo_fingerprint_ignoring_jsonb(jb, ignore, (uint8 *) VARDATA(result));
	PG_RETURN_BYTEA_P(result);
}
