/*-------------------------------------------------------------------------
 *
 * fingerprint_include.c
 *	  The only fields that count in the fingerprint: a scope's
 *	  fingerprint_include and idempo.fingerprint(params, ignore, include).
 *
 * A path names a field from the top of the document: object keys separated
 * by dots, and [*] for "every element of this array" ('order',
 * 'customer.id', 'items[*].sku', 'lines[*][*].qty').  A backslash takes the
 * next character literally, so keys with dots, brackets or backslashes can be
 * named ('a\.b' is the key "a.b").  The document is projected onto the paths:
 *
 *	 - a field a path ends on is kept whole, whatever its value;
 *	 - an object on a path keeps only the members on which some path finds
 *	   something (an object where nothing is found is left out, so
 *	   {"meta":{}} and {} count the same under 'meta.trace_id');
 *	 - an array on a path through [*] keeps every element, in order, each
 *	   projected in turn; an element where nothing is found becomes {} (the
 *	   number of elements counts, their other fields do not);
 *	 - a path that is absent, or runs into a value of another kind, finds
 *	   nothing.
 *
 * A document whose top is not an object is fingerprinted whole (paths name
 * fields from a top-level object; fingerprint_ignore leaves such documents
 * alone too), and one where nothing is found counts as {}.  The projection is
 * a new jsonb, fingerprinted with the usual canonical encoding; with
 * fingerprint_ignore as well, the ignored fields are then left out of the
 * projection (claim.c).  test/fingerprint/reference.py implements the same
 * rules independently.
 *
 * Limits as for fingerprint_ignore: at most IDEMPO_IGNORE_MAX_PATHS paths of
 * at most IDEMPO_IGNORE_MAX_PATH_BYTES bytes.  A NULL element, an empty path
 * and a path that breaks the grammar are refused with 22023; check_scope()
 * refuses the same for scopes.  The checks that do not depend on the
 * grammar are the ignore list's own (idempo_path_list(), fingerprint_rules.c).
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

PG_FUNCTION_INFO_V1(idempo_fingerprint_rules);

/* the tree of the paths: IdempoPathNode (idempo.h), shared by both lists */
struct IdempoInclude
{
	IdempoPathNode root;
};

static IdempoPathNode *
node_add_each(MemoryContext cxt, IdempoPathNode *n)
{
	if (n->each == NULL)
		n->each = MemoryContextAllocZero(cxt, sizeof(IdempoPathNode));
	return n->each;
}

#define INCLUDE_GRAMMAR_HINT \
	"A path is object keys separated by dots, each optionally followed by [*] for every element of an array, e.g. 'order', 'customer.id', 'items[*].sku'; a backslash takes the next character literally ('a\\.b' is the key \"a.b\")."

static const IdempoPathList include_list = {
	"include",
	"Pass e.g. ARRAY['order', 'items[*].sku'].",
	"Name the fields that identify the request; a path that ends on an object counts all of it.",
	INCLUDE_GRAMMAR_HINT
};

/* Refuses a path that breaks the grammar. */
static void
refuse_grammar(const char *scope, int index, const char *what)
{
	idempo_path_refuse(&include_list, scope, index, what, INCLUDE_GRAMMAR_HINT);
}

/* Adds one path (p, len bytes) below root; refuses it if it breaks the grammar. */
static void
compile_path(MemoryContext cxt, IdempoPathNode *root, const char *p, int len, const char *scope,
			 int index)
{
	IdempoPathNode *node = root;
	char	   *key = palloc(len + 1);
	int			pos = 0;

	for (;;)
	{
		int			keylen = 0;

		/* a key: up to an unescaped '.', '[' or the end */
		while (pos < len && p[pos] != '.' && p[pos] != '[')
		{
			if (p[pos] == '\\')
			{
				if (++pos == len)
					refuse_grammar(scope, index, psprintf("(\"%s\") ends in a lone backslash", pnstrdup(p, len)));
			}
			key[keylen++] = p[pos++];
		}
		if (keylen == 0)
			refuse_grammar(scope, index, psprintf("(\"%s\") has an empty key at byte %d", pnstrdup(p, len), pos + 1));
		node = idempo_path_add_key(cxt, node, key, keylen);
		/* any number of [*] */
		while (pos < len && p[pos] == '[')
		{
			if (len - pos < 3 || p[pos + 1] != '*' || p[pos + 2] != ']')
				refuse_grammar(scope, index, psprintf("(\"%s\") has '[' at byte %d that does not start [*]", pnstrdup(p, len), pos + 1));
			node = node_add_each(cxt, node);
			pos += 3;
		}
		if (pos == len)
			break;
		if (p[pos] != '.')
			refuse_grammar(scope, index, psprintf("(\"%s\") has no dot after [*] at byte %d", pnstrdup(p, len), pos + 1));
		pos++;
		if (pos == len)
			refuse_grammar(scope, index, psprintf("(\"%s\") ends in a dot", pnstrdup(p, len)));
	}
	node->terminal = true;
	pfree(key);
}

/*
 * Compiles a text[] of paths into a tree allocated in cxt; NULL when the
 * list is empty (every field counts).  scope names the scope in errors
 * (NULL: the caller is idempo.fingerprint()).
 */
IdempoInclude *
idempo_include_compile(ArrayType *paths, MemoryContext cxt, const char *scope)
{
	text	  **texts;
	int			n;
	int			i;
	IdempoInclude *root;

	if (paths == NULL)
		return NULL;
	n = idempo_path_list(paths, &include_list, scope, &texts);
	if (n == 0)
		return NULL;

	root = MemoryContextAllocZero(cxt, sizeof(IdempoInclude));
	for (i = 0; i < n; i++)
		compile_path(cxt, &root->root, VARDATA_ANY(texts[i]), VARSIZE_ANY_EXHDR(texts[i]), scope, i + 1);
	return root;
}

/* Whether the projection of v (a scalar, or a container as jbvBinary) below node finds anything. */
static bool
finds(JsonbValue *v, const IdempoPathNode *node)
{
	check_stack_depth();
	if (node->terminal)
		return true;
	if (v->type != jbvBinary)
		return false;
	if (JsonContainerIsArray(v->val.binary.data))
		return node->each != NULL;
	if (JsonContainerIsObject(v->val.binary.data) && node->nkeys > 0)
	{
		int			i;

		for (i = 0; i < node->nkeys; i++)
		{
			JsonbValue *m = getKeyJsonValueFromContainer(v->val.binary.data, node->keys[i]->key,
														 node->keys[i]->keylen, NULL);

			if (m != NULL && finds(m, node->keys[i]))
				return true;
		}
	}
	return false;
}

/* Pushes the projection of v below node, which finds something (finds()). */
static void
push_projection(JsonbInState *state, JsonbIteratorToken seq, JsonbValue *v, const IdempoPathNode *node)
{
	JsonbIterator *it;
	JsonbValue	x;
	JsonbIteratorToken tok;

	CHECK_FOR_INTERRUPTS();
	if (node->terminal)
	{
		pushJsonbValue(state, seq, v);
		return;
	}
	it = JsonbIteratorInit(v->val.binary.data);
	if (JsonContainerIsArray(v->val.binary.data))
	{
		while ((tok = JsonbIteratorNext(&it, &x, true)) != WJB_DONE)
		{
			if (tok == WJB_BEGIN_ARRAY || tok == WJB_END_ARRAY)
				pushJsonbValue(state, tok, NULL);
			else if (tok != WJB_ELEM)
				elog(ERROR, "unexpected jsonb iterator token %d in an array", (int) tok);
			else if (finds(&x, node->each))
				push_projection(state, WJB_ELEM, &x, node->each);
			else
			{
				/* the element is kept, as {}: the number of elements counts */
				pushJsonbValue(state, WJB_BEGIN_OBJECT, NULL);
				pushJsonbValue(state, WJB_END_OBJECT, NULL);
			}
		}
		return;
	}
	while ((tok = JsonbIteratorNext(&it, &x, true)) != WJB_DONE)
	{
		const IdempoPathNode *child;
		JsonbValue	key;

		switch (tok)
		{
			case WJB_BEGIN_OBJECT:
			case WJB_END_OBJECT:
				pushJsonbValue(state, tok, NULL);
				break;
			case WJB_KEY:
				key = x;
				child = idempo_path_key(node, key.val.string.val, key.val.string.len);
				tok = JsonbIteratorNext(&it, &x, true);
				if (tok != WJB_VALUE)
					elog(ERROR, "unexpected jsonb iterator token %d after a key", (int) tok);
				if (child != NULL && finds(&x, child))
				{
					pushJsonbValue(state, WJB_KEY, &key);
					push_projection(state, WJB_VALUE, &x, child);
				}
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d in an object", (int) tok);
		}
	}
}

/* The document projected onto the included paths (itself without any, or if not an object). */
Jsonb *
idempo_include_apply(Jsonb *jb, const IdempoInclude *include)
{
	JsonbInState state;
	JsonbValue	root;

	if (include == NULL || !JB_ROOT_IS_OBJECT(jb))
		return jb;
	memset(&state, 0, sizeof(state));
	root.type = jbvBinary;
	root.val.binary.data = &jb->root;
	root.val.binary.len = VARSIZE(jb) - VARHDRSZ;
	if (finds(&root, &include->root))
		push_projection(&state, WJB_VALUE, &root, &include->root);
	else
	{
		pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
		pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	}
	if (state.result == NULL)
		elog(ERROR, "projecting a jsonb object returned nothing");
	return JsonbValueToJsonb(state.result);
}

/* The document as its fingerprint sees it: projected onto include, then without ignore. */
Jsonb *
idempo_fingerprint_view(Jsonb *jb, const IdempoInclude *include, const IdempoIgnore *ignore)
{
	return idempo_ignore_apply(idempo_include_apply(jb, include), ignore);
}

/*
 * idempo.fingerprint(params jsonb, ignore text[], include text[]) RETURNS
 * bytea: what a claim computes in a scope with these rules; NULL lists: no
 * such rule.
 */
Datum
idempo_fingerprint_rules(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb;
	IdempoIgnore *ignore;
	IdempoInclude *include;
	bytea	   *result;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	jb = PG_GETARG_JSONB_P(0);
	ignore = PG_ARGISNULL(1) ? NULL :
		idempo_ignore_compile(PG_GETARG_ARRAYTYPE_P(1), CurrentMemoryContext, NULL);
	include = PG_ARGISNULL(2) ? NULL :
		idempo_include_compile(PG_GETARG_ARRAYTYPE_P(2), CurrentMemoryContext, NULL);
	result = palloc(VARHDRSZ + IDEMPO_DIGEST_LEN);
	SET_VARSIZE(result, VARHDRSZ + IDEMPO_DIGEST_LEN);
	idempo_fingerprint_jsonb(idempo_fingerprint_view(jb, include, ignore), (uint8 *) VARDATA(result));
	PG_RETURN_BYTEA_P(result);
}
