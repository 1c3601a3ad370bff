/*-------------------------------------------------------------------------
 *
 * canonical.h
 *	  The canonical encoding of a JSON value that idempo.fingerprint() hashes.
 *
 * Plain C with no PostgreSQL dependency, so that the encoder can be fuzzed
 * outside the server (test/fuzz).  The encoding, as published in docs/fingerprints.md:
 *
 *	 null            'n'
 *	 false / true    'f' / 't'
 *	 number          'N' len:u32be  minimal decimal text: -?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?
 *	 string          'S' len:u32be  UTF-8 bytes
 *	 array           'A' count:u32be  elements in order
 *	 object          'O' count:u32be  (string key, value) pairs, keys ordered by
 *	                                  byte length, then bytewise (jsonb's order)
 *
 * Every item carries its own length or count, so distinct values can never
 * produce the same byte string.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPO_CANONICAL_H
#define IDEMPO_CANONICAL_H

#include <stddef.h>
#include <stdint.h>

typedef void (*canon_sink_fn) (void *arg, const uint8_t *data, size_t len);

typedef struct CanonWriter
{
	canon_sink_fn sink;
	void	   *arg;
} CanonWriter;

extern void canon_null(CanonWriter *w);
extern void canon_bool(CanonWriter *w, int value);
extern void canon_string(CanonWriter *w, const char *s, size_t len);
extern int	canon_number(CanonWriter *w, const char *text, size_t len);
extern void canon_array(CanonWriter *w, uint32_t count);
extern void canon_object(CanonWriter *w, uint32_t count);

#endif							/* IDEMPO_CANONICAL_H */
