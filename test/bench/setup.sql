-- Database "bench" of test/bench/run: the business table, the tables and functions of the
-- comparison variants, and the fixtures of the replay and busy paths.
-- psql variable :fixture = rows per fixture.  Run as superuser.

CREATE EXTENSION idempo;
-- a 1-hour lease keeps the busy fixture's leases live for the whole run
SELECT idempo.create_scope('bench', retention => '7 days', lease => '1 hour') \gset

-- The business write every variant does.
CREATE TABLE shipments (
    id         bigserial   PRIMARY KEY,
    order_ref  text        NOT NULL,
    sku        text        NOT NULL,
    qty        integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Floor: a bare dedup table, (scope, key) primary key and nothing else.
CREATE TABLE dedup (scope text, key text, PRIMARY KEY (scope, key));
-- Floor with idempo's record (floor_record.sql): a plain table like idempo.operations, with the same
-- columns, primary key and sweep_at index.
CREATE TABLE record_copy (LIKE idempo.operations INCLUDING ALL);

-- Plain SQL: the same protection as bare statements (insert-on-conflict with a digest, then update).
CREATE TABLE plain_ops (
    scope        text        NOT NULL,
    key          text        NOT NULL,
    fingerprint  bytea       NOT NULL,
    status       text        NOT NULL DEFAULT 'in_progress',
    result       jsonb,
    target_ref   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    PRIMARY KEY (scope, key)
);

-- Reference: the protection written by hand in PL/pgSQL, brandur-style
-- (https://brandur.org/idempotency-keys): insert on conflict, select for update,
-- compare the sha256 fingerprint, later update to done.  Not part of the extension.
CREATE TABLE ref_ops (LIKE plain_ops INCLUDING ALL);
ALTER TABLE ref_ops ADD COLUMN locked_at timestamptz;

CREATE FUNCTION ref_claim(p_scope text, p_key text, p_params jsonb) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    fp  bytea := sha256(convert_to(p_params::text, 'UTF8'));
    rec ref_ops;
BEGIN
    INSERT INTO ref_ops (scope, key, fingerprint, locked_at) VALUES (p_scope, p_key, fp, now())
    ON CONFLICT (scope, key) DO NOTHING;
    SELECT * INTO rec FROM ref_ops WHERE scope = p_scope AND key = p_key FOR UPDATE;
    IF rec.fingerprint <> fp THEN
        RETURN 'conflict';
    ELSIF rec.status = 'succeeded' THEN
        RETURN 'replay';
    ELSIF rec.locked_at <> now() THEN      -- started by another transaction
        RETURN 'busy';
    END IF;
    RETURN 'acquired';
END $$;

CREATE FUNCTION ref_complete(p_scope text, p_key text, p_result jsonb, p_target_ref text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ref_ops SET status = 'succeeded', result = p_result, target_ref = p_target_ref,
                       locked_at = NULL, completed_at = now()
    WHERE scope = p_scope AND key = p_key;
END $$;

-- Fixtures, with the fingerprint of {"sku": "A-7", "qty": 1}:
--   r1..rN  succeeded (replay path; conflict path with other params)
--   l1..lN  in_progress with a live lease (busy path, committed holder)
INSERT INTO idempo.operations (scope, key, fingerprint, status, attempt, first_seen_at, last_attempt_at,
                               lease_expires_at, completed_at, expires_at, sweep_at, result, target_ref)
SELECT 'bench', p || i, idempo.fingerprint('{"sku": "A-7", "qty": 1}'), s::idempo.status, 1, now(), now(),
       CASE WHEN p = 'l' THEN now() + interval '1 hour' END,
       CASE WHEN p = 'r' THEN now() END,
       CASE WHEN p = 'r' THEN now() + interval '7 days' END,
       now() + CASE WHEN p = 'r' THEN interval '7 days' ELSE interval '1 hour' END,
       CASE WHEN p = 'r' THEN '{"shipment_id": 17}'::jsonb END,
       CASE WHEN p = 'r' THEN 'SHP-' || i END
FROM (VALUES ('r', 'succeeded'), ('l', 'in_progress')) f(p, s), generate_series(1, :fixture) i;

-- Seed the tables of the other variants with as many rows as the fixtures above, so that no variant
-- starts from an empty table (a plan made while a table looks empty scans it whole).
INSERT INTO dedup SELECT 'seed', 's' || i FROM generate_series(1, 2 * :fixture) i;
INSERT INTO plain_ops (scope, key, fingerprint, status, result, target_ref, completed_at)
SELECT 'seed', 's' || i, sha256(int8send(i)), 'succeeded', '{"shipment_id": 17}', 'SHP-' || i, now()
FROM generate_series(1, 2 * :fixture) i;
INSERT INTO ref_ops (scope, key, fingerprint, status, result, target_ref, completed_at)
SELECT scope, key, fingerprint, status, result, target_ref, completed_at FROM plain_ops;
INSERT INTO shipments (order_ref, sku, qty) SELECT 's' || i, 'A-7', 1 FROM generate_series(1, 2 * :fixture) i;

-- What each path answers (checked by the runner before measuring).
CREATE VIEW path_check AS
SELECT (SELECT outcome FROM idempo.claim('bench', 'r1', params => '{"sku": "A-7", "qty": 1}'))::text AS replay,
       (SELECT outcome FROM idempo.claim('bench', 'l1', params => '{"sku": "A-7", "qty": 1}', wait => false))::text AS busy_lease,
       (SELECT outcome FROM idempo.claim('bench', 'r1', params => '{"sku": "A-7", "qty": 2}'))::text AS conflict;
