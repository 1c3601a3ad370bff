-- The warehouse: a separate system (its own database, reached over its own connection), so
-- its writes are never part of the orders database's transactions.
CREATE TABLE shipments (
    id              bigserial PRIMARY KEY,
    order_id        bigint NOT NULL,
    sku             text NOT NULL,
    qty             int NOT NULL,
    idempotency_key text UNIQUE,          -- used by the idempotent API only
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON shipments (order_id);

-- Mode (a): the API honours an idempotency key and returns the existing shipment.
CREATE FUNCTION create_shipment_idempotent(p_key text, p_order bigint, p_sku text, p_qty int)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO shipments (order_id, sku, qty, idempotency_key) VALUES (p_order, p_sku, p_qty, p_key)
    ON CONFLICT (idempotency_key) DO UPDATE SET idempotency_key = EXCLUDED.idempotency_key
    RETURNING id
$$;

-- Mode (b): the API does not know idempotency keys; every call creates a shipment.
CREATE FUNCTION create_shipment(p_order bigint, p_sku text, p_qty int)
RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO shipments (order_id, sku, qty) VALUES (p_order, p_sku, p_qty) RETURNING id
$$;
