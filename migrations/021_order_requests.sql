-- The Idempotency-Key of every pay and update that changed an order, kept
-- for as long as the order, as the order keeps its creating key: a retry
-- that comes after the key's row expired is answered 409 with what the key
-- did, instead of running again (a pay of a declined order would start a
-- second charge attempt) or being refused as if it had never run (an update
-- would get 412, "not applied"). Written in the step's own round trip; read
-- only when the step meets a key it wrote before.
CREATE TABLE order_requests (
    tenant_id       text        NOT NULL,
    order_id        uuid        NOT NULL,
    scope           text        NOT NULL CHECK (scope IN ('pay', 'update')),
    idempotency_key text        NOT NULL,
    version         bigint      NOT NULL, -- the order's version the request made
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id, scope, idempotency_key)
);

---- create above / drop below ----

DROP TABLE order_requests;
