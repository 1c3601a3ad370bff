-- Database "bench" of test/bench/managed, on each server (the extension is created first: the
-- C edition, or the managed edition through pg_tle): the business table and plain SQL's table,
-- as in setup.sql.
SELECT idempo.create_scope('bench', retention => '7 days', lease => '1 hour') \gset
CREATE TABLE shipments (
    id         bigserial   PRIMARY KEY,
    order_ref  text        NOT NULL,
    sku        text        NOT NULL,
    qty        integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
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
