-- Payments through the provider (#11): the order's payment and refund state,
-- the provider's outcomes, and the inbox of the consumer that records them.

-- The latest charge attempt and the refund of an order, as the domain's
-- Payment and Refund structs (JSON); '{}' is "never asked".
ALTER TABLE orders
    ADD COLUMN payment jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN refund  jsonb NOT NULL DEFAULT '{}';
ALTER TABLE order_views
    ADD COLUMN payment jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN refund  jsonb NOT NULL DEFAULT '{}';

-- Counts of the two new statuses.
ALTER TABLE customer_summaries
    ADD COLUMN orders_payment_pending bigint NOT NULL DEFAULT 0,
    ADD COLUMN orders_payment_failed  bigint NOT NULL DEFAULT 0;

-- One row per outcome the provider gave us for a derived idempotency key:
-- a charge (succeeded or declined) or a refund (succeeded or failed). It is
-- written with the order's transition, or alone for a stale outcome (an
-- older attempt, or an order no longer payment_pending), so our records
-- always hold every charge the provider made.
CREATE TABLE payments (
    tenant_id       text        NOT NULL,
    order_id        uuid        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    attempt         integer     NOT NULL CHECK (attempt >= 1),
    idempotency_key text        NOT NULL,
    provider_id     text        NOT NULL DEFAULT '', -- "pi_…" / "re_…"; '' if the provider gave none
    amount          bigint      NOT NULL,
    currency        char(3)     NOT NULL,
    status          text        NOT NULL CHECK (status IN ('succeeded', 'declined', 'failed')),
    reason          text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (idempotency_key)
);
CREATE INDEX payments_by_order ON payments (tenant_id, order_id);

-- One row per intent event (payment.requested, refund.requested) whose
-- outcome a consumer recorded, written in the same transaction: a
-- redelivered intent finds its row and records nothing twice. Apart from
-- the projections' inbox, so that its pruning never touches these rows.
CREATE TABLE payment_inbox (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    tenant_id   text        NOT NULL,
    order_id    uuid        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

---- create above / drop below ----

DROP TABLE payment_inbox;
DROP TABLE payments;
ALTER TABLE customer_summaries DROP COLUMN orders_payment_pending, DROP COLUMN orders_payment_failed;
ALTER TABLE order_views DROP COLUMN payment, DROP COLUMN refund;
ALTER TABLE orders DROP COLUMN payment, DROP COLUMN refund;
