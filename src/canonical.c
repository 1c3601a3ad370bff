/*-------------------------------------------------------------------------
 *
 * canonical.c
 *	  Writer of the canonical encoding (see canonical.h).  No allocation, no
 *	  recursion: callers stream events in document order.
 *
 *-------------------------------------------------------------------------
 */
#include "canonical.h"

static void
put_tag_and_u32(CanonWriter *w, char tag, uint32_t n)
{
	uint8_t		buf[5];

	buf[0] = (uint8_t) tag;
	buf[1] = (uint8_t) (n >> 24);
	buf[2] = (uint8_t) (n >> 16);
	buf[3] = (uint8_t) (n >> 8);
	buf[4] = (uint8_t) n;
	w->sink(w->arg, buf, sizeof(buf));
}

void
canon_null(CanonWriter *w)
{
	w->sink(w->arg, (const uint8_t *) "n", 1);
}

void
canon_bool(CanonWriter *w, int value)
{
	w->sink(w->arg, (const uint8_t *) (value ? "t" : "f"), 1);
}

void
canon_string(CanonWriter *w, const char *s, size_t len)
{
	put_tag_and_u32(w, 'S', (uint32_t) len);
	if (len > 0)
		w->sink(w->arg, (const uint8_t *) s, len);
}

void
canon_array(CanonWriter *w, uint32_t count)
{
	put_tag_and_u32(w, 'A', count);
}

void
canon_object(CanonWriter *w, uint32_t count)
{
	put_tag_and_u32(w, 'O', count);
}

static int
is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/*
 * A number given as plain decimal text (what numeric_out prints:
 * -?[0-9]+(\.[0-9]+)?), written in its minimal form so that 1, 1.0 and 01.00
 * agree.  Returns -1, writing nothing, for any other text.
 */
int
canon_number(CanonWriter *w, const char *text, size_t len)
{
	size_t		pos = 0;
	size_t		int_start,
				int_end,
				frac_start,
				frac_end;
	int			negative = 0;
	int			zero;
	size_t		out_len;

	if (pos < len && text[pos] == '-')
	{
		negative = 1;
		pos++;
	}
	int_start = pos;
	while (pos < len && is_digit(text[pos]))
		pos++;
	int_end = pos;
	if (int_end == int_start)
		return -1;
	frac_start = frac_end = pos;
	if (pos < len && text[pos] == '.')
	{
		pos++;
		frac_start = pos;
		while (pos < len && is_digit(text[pos]))
			pos++;
		frac_end = pos;
		if (frac_end == frac_start)
			return -1;
	}
	if (pos != len)
		return -1;

	/* leading zeros of the integer part, trailing zeros of the fraction */
	while (int_end - int_start > 1 && text[int_start] == '0')
		int_start++;
	while (frac_end > frac_start && text[frac_end - 1] == '0')
		frac_end--;

	zero = (int_end - int_start == 1 && text[int_start] == '0' && frac_end == frac_start);
	if (zero)
		negative = 0;			/* there is no negative zero */

	out_len = (size_t) negative + (int_end - int_start) +
		(frac_end > frac_start ? 1 + (frac_end - frac_start) : 0);
	put_tag_and_u32(w, 'N', (uint32_t) out_len);
	if (negative)
		w->sink(w->arg, (const uint8_t *) "-", 1);
	w->sink(w->arg, (const uint8_t *) text + int_start, int_end - int_start);
	if (frac_end > frac_start)
	{
		w->sink(w->arg, (const uint8_t *) ".", 1);
		w->sink(w->arg, (const uint8_t *) text + frac_start, frac_end - frac_start);
	}
	return 0;
}
