-- The shop both HTTP examples serve: its tables and its two idempo scopes.
-- Load it once per database:  psql -d shop -f schema.sql   (needs a superuser for CREATE EXTENSION)

CREATE EXTENSION IF NOT EXISTS idempo;

CREATE SCHEMA shop;

-- POST /orders writes one row here, in the same transaction as its claim.
CREATE TABLE shop.orders (
    id         integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,   -- a JSON number in every client
    customer   text NOT NULL,
    sku        text NOT NULL,
    qty        integer NOT NULL CHECK (qty > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- POST /payments charges an outside payment provider first, then writes one row here in the
-- same transaction as complete().  charge_id is unique as a last line of defence: the provider
-- answers a retried charge with the charge it already made.
CREATE TABLE shop.payments (
    id           integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id     integer NOT NULL,
    amount_cents integer NOT NULL CHECK (amount_cents > 0),
    charge_id    text NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- One scope per endpoint.  Retention is how long a client may retry with the same key
-- (Stripe keeps keys 24 hours).
SELECT idempo.create_scope('http.orders', retention => '24 hours', owner => 'shop-api',
                           description => 'POST /orders, Idempotency-Key header');

-- The payment call leaves the database, so the claim commits first and holds a lease while the
-- provider is called.  The lease must outlast the slowest provider call (the example's timeout is
-- 10 s).  The provider honours our key, so a lease that runs out (the service died mid-call) may
-- simply be retried: on_lease_expiry => 'retry'.
SELECT idempo.create_scope('http.payments', retention => '24 hours', lease => '30 seconds',
                           on_lease_expiry => 'retry', max_attempts => 5, owner => 'shop-api',
                           description => 'POST /payments, Idempotency-Key header, calls the provider');
