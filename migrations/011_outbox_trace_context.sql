-- The W3C trace context (traceparent, tracestate) of the request that wrote
-- an outbox event (#13 item 2). The relay sends it as NATS message headers so
-- the projector and the payment worker continue the request's trace. Columns,
-- not a field of the envelope, so the relay reads them without parsing the
-- payload; nullable and without a default, so adding them rewrites nothing
-- and an untraced event (tracing off) stores nothing but its null bits.
ALTER TABLE outbox ADD COLUMN traceparent text, ADD COLUMN tracestate text;

---- create above / drop below ----

ALTER TABLE outbox DROP COLUMN traceparent, DROP COLUMN tracestate;
