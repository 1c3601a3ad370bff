-- Every transition of the state machine (src/idempo.h): the status and attempt it leaves,
-- the review it opens and the event it logs.  Each row prepares key $k in an audited scope,
-- then takes one action "later" seconds after the start (via idempo.clock_offset), in a
-- transaction of its own (a claim by the transaction that acquired the key answers that
-- again).  So the file runs without an outer transaction: the procedure commits, the TAP lines
-- are collected and printed at the end, and the scopes' rows are deleted.
SET client_min_messages = warning;
SELECT plan(27 * 4 + 2);

SELECT lives_ok($$SELECT idempo.create_scope('t', retention => '1 hour', lease => '1 minute',
                  verify_settle => '5 minutes', max_attempts => 2, audit => true)$$, 'scope t');
SELECT lives_ok($$SELECT idempo.create_scope('t.retry', retention => '1 hour', lease => '1 minute',
                  on_lease_expiry => 'retry', audit => true)$$, 'scope t.retry');

CREATE TEMP TABLE transitions (name text, scope text, prepare text, later int, action text,
                               status idempo.status, attempt int, review text, event text);
INSERT INTO transitions VALUES
 ('claim a new key',                 't', '', 0, $$SELECT idempo.claim('t', $k)$$, 'in_progress', 1, NULL, 'claim'),
 ('complete',                        't', $$SELECT idempo.claim('t', $k)$$, 0, $$SELECT idempo.complete('t', $k, 1)$$, 'succeeded', 1, NULL, 'complete'),
 ('fail, retryable',                 't', $$SELECT idempo.claim('t', $k)$$, 0, $$SELECT idempo.fail('t', $k, 1, 'e', true)$$, 'retryable', 1, NULL, 'fail'),
 ('fail, final',                     't', $$SELECT idempo.claim('t', $k)$$, 0, $$SELECT idempo.fail('t', $k, 1, 'e', false)$$, 'failed', 1, NULL, 'fail'),
 ('claim a retryable one',           't', $$SELECT idempo.claim('t', $k); SELECT idempo.fail('t', $k, 1)$$, 0, $$SELECT idempo.claim('t', $k)$$, 'in_progress', 2, NULL, 'claim'),
 ('claim after max_attempts',        't', $$SELECT idempo.claim('t', $k); SELECT idempo.fail('t', $k, 1); SELECT idempo.claim('t', $k); SELECT idempo.fail('t', $k, 2)$$, 0, $$SELECT idempo.claim('t', $k)$$, 'in_review', 2, 'attempts_exhausted', 'claim'),
 ('claim after the lease',           't', $$SELECT idempo.claim('t', $k)$$, 120, $$SELECT idempo.claim('t', $k)$$, 'unknown', 1, NULL, 'claim'),
 ('sweep after the lease',           't', $$SELECT idempo.claim('t', $k)$$, 120, $$SELECT idempo.sweep()$$, 'unknown', 1, NULL, 'sweep'),
 ('claim after the lease, retry',    't.retry', $$SELECT idempo.claim('t.retry', $k)$$, 120, $$SELECT idempo.claim('t.retry', $k)$$, 'in_progress', 2, NULL, 'claim'),
 ('sweep after the lease, retry',    't.retry', $$SELECT idempo.claim('t.retry', $k)$$, 120, $$SELECT idempo.sweep()$$, 'retryable', 1, NULL, 'sweep'),
 ('late complete of unknown',        't', $$SELECT idempo.claim('t', $k); SELECT idempo.sweep()$$, 120, $$SELECT idempo.complete('t', $k, 1)$$, 'succeeded', 1, NULL, 'complete'),
 ('late fail of unknown',            't', $$SELECT idempo.claim('t', $k)$$, 120, $$SELECT idempo.fail('t', $k, 1, 'e', false)$$, 'failed', 1, NULL, 'fail'),
 ('late complete of retryable',      't', $$SELECT idempo.claim('t', $k); SELECT idempo.fail('t', $k, 1)$$, 0, $$SELECT idempo.complete('t', $k, 1)$$, 'succeeded', 1, NULL, 'complete'),
 ('verify found',                    't', $$SELECT idempo.claim('t', $k)$$, 120, $$SELECT idempo.verify('t', $k, 1, true, 'T-1')$$, 'succeeded', 1, NULL, 'verify found'),
 ('verify not found, unsettled',     't', $$SELECT idempo.claim('t', $k)$$, 120, $$SELECT idempo.verify('t', $k, 1, false)$$, 'unknown', 1, NULL, 'verify not found'),
 ('verify not found, settled',       't', $$SELECT idempo.claim('t', $k)$$, 400, $$SELECT idempo.verify('t', $k, 1, false)$$, 'retryable', 1, NULL, 'verify not found'),
 ('claim after retention',           't', $$SELECT idempo.claim('t', $k); SELECT idempo.fail('t', $k, 1)$$, 4000, $$SELECT idempo.claim('t', $k)$$, 'in_review', 1, 'retention_expired', 'claim'),
 ('sweep after retention',           't', $$SELECT idempo.claim('t', $k)$$, 4000, $$SELECT idempo.sweep()$$, 'in_review', 1, 'retention_expired', 'sweep'),
 ('claim a stale intent',            't', '', 0, $$SELECT idempo.claim('t', $k, intent_at => now() - interval '1 day')$$, 'in_review', 0, 'stale_retry', 'claim'),
 ('claim an expired finished one',   't', $$SELECT idempo.claim('t', $k); SELECT idempo.complete('t', $k, 1)$$, 4000, $$SELECT idempo.claim('t', $k)$$, 'in_progress', 1, NULL, 'claim'),
 ('request_review',                  't', $$SELECT idempo.claim('t', $k)$$, 0, $$SELECT idempo.request_review('t', $k, 'hold')$$, 'in_review', 1, 'manual', 'request_review'),
 ('request_review of a finished one','t', $$SELECT idempo.claim('t', $k); SELECT idempo.complete('t', $k, 1)$$, 0, $$SELECT idempo.request_review('t', $k)$$, 'in_review', 1, 'manual', 'request_review'),
 ('resolve unknown: succeeded',      't', $$SELECT idempo.claim('t', $k)$$, 120, $$SELECT idempo.resolve('t', $k, 'succeeded', 'r')$$, 'succeeded', 1, NULL, 'resolve'),
 ('resolve in_review: succeeded',    't', $$SELECT idempo.claim('t', $k); SELECT idempo.request_review('t', $k)$$, 0, $$SELECT idempo.resolve('t', $k, 'succeeded', 'r')$$, 'succeeded', 1, NULL, 'resolve'),
 ('resolve in_review: not_executed', 't', $$SELECT idempo.claim('t', $k); SELECT idempo.request_review('t', $k)$$, 0, $$SELECT idempo.resolve('t', $k, 'not_executed', 'r')$$, 'retryable', 1, NULL, 'resolve'),
 ('resolve in_review: failed',       't', $$SELECT idempo.claim('t', $k); SELECT idempo.request_review('t', $k)$$, 0, $$SELECT idempo.resolve('t', $k, 'failed', 'r')$$, 'failed', 1, NULL, 'resolve'),
 ('sweep an expired finished one',   't', $$SELECT idempo.claim('t', $k); SELECT idempo.complete('t', $k, 1)$$, 4000, $$SELECT idempo.sweep()$$, NULL, NULL, NULL, NULL);

CREATE TEMP TABLE tap_out (n serial, line text);
CREATE PROCEDURE pg_temp.run() LANGUAGE plpgsql AS $$
DECLARE
    t record;
    k text;
    o idempo.operations;
    stmt text;
BEGIN
    FOR t IN SELECT * FROM transitions LOOP
        k := quote_literal(t.name);
        FOREACH stmt IN ARRAY string_to_array(replace(t.prepare, '$k', k), ';') LOOP
            IF btrim(stmt) <> '' THEN EXECUTE stmt; END IF;
        END LOOP;
        COMMIT;
        PERFORM set_config('idempo.clock_offset', t.later::text, true);
        EXECUTE replace(t.action, '$k', k);
        PERFORM set_config('idempo.clock_offset', '0', true);
        COMMIT;
        o := idempo.lookup(t.scope, t.name);
        INSERT INTO tap_out (line) VALUES (is(o.status, t.status, t.name || ': status'));
        INSERT INTO tap_out (line) VALUES (is(o.attempt, t.attempt, t.name || ': attempt'));
        INSERT INTO tap_out (line) VALUES (is((SELECT string_agg(reason, ',') FROM idempo.reviews r
                        WHERE r.key = t.name AND r.resolved_at IS NULL), t.review, t.name || ': open review'));
        INSERT INTO tap_out (line) VALUES (is((SELECT e.action FROM idempo.events e WHERE e.key = t.name
                        ORDER BY e.id DESC LIMIT 1),
                       CASE WHEN t.event IS NULL THEN 'complete' ELSE t.event END,
                       t.name || ': last event'));
    END LOOP;
END $$;

CALL pg_temp.run();
SELECT line FROM tap_out ORDER BY n;
SELECT * FROM finish();

DELETE FROM idempo.conflicts WHERE scope IN ('t', 't.retry');
DELETE FROM idempo.reviews WHERE scope IN ('t', 't.retry');
DELETE FROM idempo.events WHERE scope IN ('t', 't.retry');
DELETE FROM idempo.operations WHERE scope IN ('t', 't.retry');
DELETE FROM idempo.scopes WHERE name IN ('t', 't.retry');
