-- The fake provider's ledger: one Stripe account. Its own database, its own
-- schema; nothing here is shared with the order service.

-- Stripe's idempotency layer: the first response of each key, replayed for
-- 24 h to a request with the same parameters (fingerprint).
CREATE TABLE idempotency_keys (
    key         text        PRIMARY KEY,
    fingerprint text        NOT NULL,
    request_id  text        NOT NULL,
    status_code int         NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);

-- PaymentIntents, created and confirmed in one call.
CREATE TABLE payment_intents (
    id              text        PRIMARY KEY,
    idempotency_key text,
    amount          bigint      NOT NULL CHECK (amount > 0),
    currency        text        NOT NULL,
    payment_method  text        NOT NULL,
    status          text        NOT NULL,
    charge_id       text        NOT NULL,
    decline_code    text        NOT NULL DEFAULT '',
    failure_code    text        NOT NULL DEFAULT '',
    failure_message text        NOT NULL DEFAULT '',
    metadata        jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payment_intents_metadata ON payment_intents USING gin (metadata jsonb_path_ops);
CREATE INDEX payment_intents_created_at ON payment_intents (created_at, id);

CREATE TABLE refunds (
    id                text        PRIMARY KEY,
    idempotency_key   text,
    payment_intent_id text        NOT NULL REFERENCES payment_intents (id),
    amount            bigint      NOT NULL CHECK (amount > 0),
    currency          text        NOT NULL,
    status            text        NOT NULL,
    failure_reason    text        NOT NULL DEFAULT '',
    metadata          jsonb       NOT NULL DEFAULT '{}',
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX refunds_payment_intent_id ON refunds (payment_intent_id);
CREATE INDEX refunds_created_at ON refunds (created_at, id);

---- create above / drop below ----

DROP TABLE refunds;
DROP TABLE payment_intents;
DROP TABLE idempotency_keys;
