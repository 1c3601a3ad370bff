/*-------------------------------------------------------------------------
 *
 * fuzz_canonical.c
 *	  libFuzzer target for the canonical fingerprint encoder (src/canonical.c).
 *	  Build and run it with test/fuzz/run.
 *
 * The fuzz input is a small program of encoder events.  Each event starts
 * with a byte whose value modulo 7 selects it:
 *
 *	 0  null
 *	 1  bool     next byte, nonzero = true
 *	 2  string   length byte L, then L bytes
 *	 3  number   length byte L, then L bytes of text as they are
 *	 4  number   length byte L, then L bytes each mapped onto "0123456789.-"
 *	             (so that many texts are at or near the number grammar)
 *	 5  array    count: next 4 bytes, big-endian
 *	 6  object   count: next 4 bytes, big-endian
 *
 * Missing bytes at the end of the input read as 0 (a slice is cut short).
 * Every event goes through the encoder into a growable buffer, and the
 * following is checked, with abort() on a violation so that libFuzzer
 * records the input as a crash:
 *
 *	 - canon_number and canon_string read nothing outside their text: it is
 *	   copied into an exactly-sized malloc'd buffer with no terminator, so
 *	   ASan reports any read past either end.
 *	 - canon_number returns 0 exactly when the text matches
 *	   -?[0-9]+(\.[0-9]+)?  (decided here by an independent automaton), and
 *	   writes nothing when it returns -1.
 *	 - an accepted number is written as 'N' + u32be length + text, where the
 *	   text matches the minimal form -?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?, is
 *	   never "-0", and has the same value as the input: both are normalized
 *	   here independently (sign, leading zeros, trailing fraction zeros) and
 *	   must agree.  So every value has one spelling, and keeps its value.
 *	 - normalization is idempotent: encoding the written text again gives
 *	   the same bytes.
 *	 - the whole output, parsed by a decoder written from the published
 *	   format (README.md, "Fingerprints"), gives back exactly the event
 *	   sequence that was encoded, with no bytes left over: the encoding is
 *	   unambiguous.
 *
 *-------------------------------------------------------------------------
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canonical.h"

#define CHECK(cond) \
	do \
	{ \
		if (!(cond)) \
		{ \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			abort(); \
		} \
	} while (0)

/* A number text is at most 255 bytes long (one length byte). */
#define MAX_SLICE 255

typedef struct Buf
{
	uint8_t    *data;
	size_t		len;
	size_t		cap;
} Buf;

/* One encoder event; the payload of 'N' and 'S' lies at off in some Buf. */
typedef struct Event
{
	uint8_t		tag;			/* n f t N S A O */
	uint32_t	n;				/* payload length, or element/pair count */
	size_t		off;
} Event;

typedef struct Reader
{
	const uint8_t *p;
	size_t		left;
} Reader;

static void
buf_append(Buf *b, const void *data, size_t len)
{
	if (len == 0)
		return;
	if (b->len + len > b->cap)
	{
		b->cap = 2 * (b->len + len) + 64;
		b->data = realloc(b->data, b->cap);
		CHECK(b->data != NULL);
	}
	memcpy(b->data + b->len, data, len);
	b->len += len;
}

static void
buf_sink(void *arg, const uint8_t *data, size_t len)
{
	buf_append((Buf *) arg, data, len);
}

static uint8_t
take_byte(Reader *r)
{
	if (r->left == 0)
		return 0;
	r->left--;
	return *r->p++;
}

/* A length byte, then that many bytes (fewer if the input ends). */
static const uint8_t *
take_slice(Reader *r, size_t *len)
{
	const uint8_t *p;

	*len = take_byte(r);
	if (*len > r->left)
		*len = r->left;
	p = r->p;
	r->p += *len;
	r->left -= *len;
	return p;
}

static uint32_t
get_u32be(const uint8_t *p)
{
	return ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16) |
		((uint32_t) p[2] << 8) | (uint32_t) p[3];
}

static int
is_digit(uint8_t c)
{
	return c >= '0' && c <= '9';
}

/*
 * Does s match -?[0-9]+(\.[0-9]+)? ?  States: 0 start, 1 after the sign,
 * 2 in the integer digits, 3 after the point, 4 in the fraction digits.
 */
static int
is_plain_decimal(const uint8_t *s, size_t len)
{
	int			state = 0;

	for (size_t i = 0; i < len; i++)
	{
		if (is_digit(s[i]))
			state = (state <= 2) ? 2 : 4;
		else if (s[i] == '-' && state == 0)
			state = 1;
		else if (s[i] == '.' && state == 2)
			state = 3;
		else
			return 0;
	}
	return state == 2 || state == 4;
}

/* Does s match -?(0|[1-9][0-9]*)(\.[0-9]*[1-9])? ? */
static int
is_minimal(const uint8_t *s, size_t len)
{
	size_t		i = 0;

	if (i < len && s[i] == '-')
		i++;
	if (i == len || !is_digit(s[i]))
		return 0;
	if (s[i] == '0')
		i++;
	else
	{
		while (i < len && is_digit(s[i]))
			i++;
	}
	if (i == len)
		return 1;
	if (s[i] != '.' || i + 1 == len || s[len - 1] == '0')
		return 0;
	for (i++; i < len; i++)
	{
		if (!is_digit(s[i]))
			return 0;
	}
	return 1;
}

/*
 * The minimal spelling of a text that is_plain_decimal accepts, written to
 * out (room for len + 1 bytes); returns its length.  Split at the point,
 * drop every leading zero of the integer part (an empty one becomes "0")
 * and every trailing zero of the fraction; zero has no sign.
 */
static size_t
normalize(const uint8_t *s, size_t len, uint8_t *out)
{
	const uint8_t *point = memchr(s, '.', len);
	int			negative = (s[0] == '-');
	const uint8_t *int_begin = s + negative;
	const uint8_t *int_end = point ? point : s + len;
	const uint8_t *frac_begin = point ? point + 1 : s + len;
	const uint8_t *frac_end = s + len;
	size_t		o = 0;

	while (int_begin < int_end && *int_begin == '0')
		int_begin++;
	while (frac_end > frac_begin && frac_end[-1] == '0')
		frac_end--;
	if (int_begin == int_end && frac_begin == frac_end)
		negative = 0;

	if (negative)
		out[o++] = '-';
	if (int_begin == int_end)
		out[o++] = '0';
	memcpy(out + o, int_begin, int_end - int_begin);
	o += int_end - int_begin;
	if (frac_begin < frac_end)
	{
		out[o++] = '.';
		memcpy(out + o, frac_begin, frac_end - frac_begin);
		o += frac_end - frac_begin;
	}
	return o;
}

/*
 * Runs canon_number on a copy of src (mapped onto the number alphabet if
 * asked) and checks what it wrote.  Returns 1 and fills *ev (payload in
 * payloads) if the number was accepted, else 0.
 */
static int
check_number(CanonWriter *w, Buf *payloads, Event *ev,
			 const uint8_t *src, size_t len, int mapped)
{
	Buf		   *out = (Buf *) w->arg;
	size_t		before = out->len;
	uint8_t    *text = malloc(len);	/* exactly sized, no terminator */
	uint8_t		expect[MAX_SLICE + 1];
	uint8_t		again_norm[MAX_SLICE + 1];
	size_t		expect_len;
	const uint8_t *item;
	uint32_t	n;
	int			rc;

	CHECK(text != NULL || len == 0);
	for (size_t i = 0; i < len; i++)
		text[i] = mapped ? (uint8_t) "0123456789.-"[src[i] % 12] : src[i];

	rc = canon_number(w, (const char *) text, len);
	CHECK(rc == 0 || rc == -1);
	CHECK((rc == 0) == is_plain_decimal(text, len));
	if (rc != 0)
	{
		CHECK(out->len == before);
		free(text);
		return 0;
	}

	/* 'N' + length + a minimal text of the same value */
	item = out->data + before;
	CHECK(out->len - before >= 5 && item[0] == 'N');
	n = get_u32be(item + 1);
	CHECK(n == out->len - before - 5);
	CHECK(is_minimal(item + 5, n));
	CHECK(!(n == 2 && memcmp(item + 5, "-0", 2) == 0));
	expect_len = normalize(text, len, expect);
	CHECK(n <= MAX_SLICE && normalize(item + 5, n, again_norm) == n &&
		  memcmp(again_norm, item + 5, n) == 0);
	CHECK(expect_len == n && memcmp(expect, item + 5, n) == 0);

	/* idempotent: the written text encodes to the same bytes */
	{
		uint8_t    *copy = malloc(n);
		Buf			again = {0};
		CanonWriter w2 = {buf_sink, &again};

		CHECK(copy != NULL || n == 0);
		memcpy(copy, item + 5, n);
		CHECK(canon_number(&w2, (const char *) copy, n) == 0);
		CHECK(again.len == 5 + (size_t) n && memcmp(again.data, item, again.len) == 0);
		free(again.data);
		free(copy);
	}

	ev->tag = 'N';
	ev->n = n;
	ev->off = payloads->len;
	buf_append(payloads, expect, expect_len);
	free(text);
	return 1;
}

/*
 * Parses an encoding into events, from the published format alone.  Returns
 * the number of events, or -1 if the bytes are not a sequence of whole,
 * well-formed items or hold more than max of them.
 */
static long
decode(const uint8_t *s, size_t len, Event *ev, size_t max)
{
	size_t		pos = 0;
	size_t		count = 0;

	while (pos < len)
	{
		Event	   *e = &ev[count];

		if (count == max)
			return -1;
		e->tag = s[pos++];
		e->n = 0;
		switch (e->tag)
		{
			case 'n':
			case 'f':
			case 't':
				break;
			case 'N':
			case 'S':
			case 'A':
			case 'O':
				if (len - pos < 4)
					return -1;
				e->n = get_u32be(s + pos);
				pos += 4;
				if (e->tag == 'N' || e->tag == 'S')
				{
					if (len - pos < e->n)
						return -1;
					e->off = pos;
					pos += e->n;
				}
				break;
			default:
				return -1;
		}
		count++;
	}
	return (long) count;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Reader		r = {data, size};
	Buf			out = {0};
	Buf			payloads = {0};
	CanonWriter w = {buf_sink, &out};
	Event	   *expected = calloc(size + 1, sizeof(Event));
	Event	   *decoded = calloc(size + 1, sizeof(Event));
	size_t		count = 0;
	long		ndecoded;

	CHECK(expected != NULL && decoded != NULL);
	while (r.left > 0)
	{
		Event	   *ev = &expected[count];
		uint8_t		op = take_byte(&r) % 7;
		const uint8_t *slice;
		size_t		len;
		uint32_t	n;

		switch (op)
		{
			case 0:
				canon_null(&w);
				ev->tag = 'n';
				count++;
				break;
			case 1:
				n = take_byte(&r);
				canon_bool(&w, (int) n);
				ev->tag = n ? 't' : 'f';
				count++;
				break;
			case 2:
				{
					uint8_t    *copy;

					slice = take_slice(&r, &len);
					copy = malloc(len); /* exactly sized, no terminator */
					CHECK(copy != NULL || len == 0);
					if (len > 0)
						memcpy(copy, slice, len);
					canon_string(&w, (const char *) copy, len);
					free(copy);
					ev->tag = 'S';
					ev->n = (uint32_t) len;
					ev->off = payloads.len;
					buf_append(&payloads, slice, len);
					count++;
				}
				break;
			case 3:
			case 4:
				slice = take_slice(&r, &len);
				count += check_number(&w, &payloads, ev, slice, len, op == 4);
				break;
			case 5:
			case 6:
				n = (uint32_t) take_byte(&r) << 24;
				n |= (uint32_t) take_byte(&r) << 16;
				n |= (uint32_t) take_byte(&r) << 8;
				n |= take_byte(&r);
				if (op == 5)
					canon_array(&w, n);
				else
					canon_object(&w, n);
				ev->tag = (op == 5) ? 'A' : 'O';
				ev->n = n;
				count++;
				break;
		}
	}

	/* round trip: the output decodes to exactly the events encoded */
	ndecoded = decode(out.data, out.len, decoded, size + 1);
	CHECK(ndecoded == (long) count);
	for (size_t i = 0; i < count; i++)
	{
		CHECK(decoded[i].tag == expected[i].tag);
		CHECK(decoded[i].n == expected[i].n);
		if (expected[i].tag == 'N' || expected[i].tag == 'S')
			CHECK(expected[i].n == 0 ||
				  memcmp(out.data + decoded[i].off,
						 payloads.data + expected[i].off, expected[i].n) == 0);
	}

	free(out.data);
	free(payloads.data);
	free(expected);
	free(decoded);
	return 0;
}
