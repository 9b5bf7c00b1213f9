-- A refund asked again after the last one failed (POST /v1/orders/{id}/refund)
-- starts a new refund attempt, as a pay starts a new charge attempt: the
-- order keeps its Idempotency-Key too, so a retry after the key's row
-- expired cannot start another.
ALTER TABLE order_requests DROP CONSTRAINT order_requests_scope_check;
ALTER TABLE order_requests ADD CONSTRAINT order_requests_scope_check CHECK (scope IN ('pay', 'update', 'refund'));

---- create above / drop below ----

DELETE FROM order_requests WHERE scope = 'refund';
ALTER TABLE order_requests DROP CONSTRAINT order_requests_scope_check;
ALTER TABLE order_requests ADD CONSTRAINT order_requests_scope_check CHECK (scope IN ('pay', 'update'));
