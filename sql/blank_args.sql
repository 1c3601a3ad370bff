-- Blank scope and key arguments: empty, or only the ASCII whitespace of C's isspace() (space,
-- \t \n \v \f \r), refused with 22023; any other character makes a name, the letter v too
-- (E'' strings have no \v escape: E'\v' is a v, a vertical tab is E'\x0b').
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('w');

-- each of the six alone, and all six together: blank keys, for every call that takes a key
SELECT encode(convert_to(k, 'UTF8'), 'hex') AS key,
       split_part(regress.err(format('SELECT idempo.claim(%L, %L)', 'w', k)), E'\n', 1) AS claim,
       split_part(regress.err(format('SELECT idempo.lookup(%L, %L)', 'w', k)), E'\n', 1) AS lookup,
       split_part(regress.err(format('SELECT idempo.stored_key(%L, %L)', 'w', k)), E'\n', 1) AS stored_key,
       split_part(regress.err(format('SELECT * FROM idempo.claim_batch(%L, ARRAY[%L])', 'w', k)), E'\n', 1) AS claim_batch
FROM unnest(ARRAY[' ', E'\t', E'\n', E'\x0b', E'\f', E'\r', E' \t\n\x0b\f\r']) k;

-- the same for scope names: blank, while a name that is not blank is looked up (and missing)
SELECT encode(convert_to(s, 'UTF8'), 'hex') AS scope,
       split_part(regress.err(format('SELECT idempo.claim(%L, %L)', s, 'k')), E'\n', 1) AS claim,
       split_part(regress.err(format('SELECT idempo.lookup(%L, %L)', s, 'k')), E'\n', 1) AS lookup,
       split_part(regress.err(format('SELECT * FROM idempo.claim_batch(%L, ARRAY[%L])', s, 'k')), E'\n', 1) AS claim_batch,
       split_part(regress.err(format('SELECT * FROM idempo.complete_batch(%L, ARRAY[%L])', s, 'k')), E'\n', 1) AS complete_batch
FROM unnest(ARRAY[E'\x0b', E' \t\n\x0b\f\r', 'v', E'\x0bv']) s;

-- keys that are not blank: v, whitespace around a name, other control characters, a no-break space
SELECT encode(convert_to(k, 'UTF8'), 'hex') AS key, c.outcome, b.outcome AS batch_outcome,
       encode(convert_to(idempo.stored_key('w', k), 'UTF8'), 'hex') AS stored
FROM unnest(ARRAY['v', E'\x0bv\x0b', E'\x1c', E'\x7f', U&'\00A0']) k,
     LATERAL idempo.claim('w', k) c,
     LATERAL idempo.claim_batch('w', ARRAY[k]) b;
SELECT count(*) AS records FROM idempo.operations WHERE scope = 'w';
