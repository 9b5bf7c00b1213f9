-- The unique index on (tenant_id, key) carries each row's stored_bytes
-- (016), so the key quota's recount sums a tenant's bytes from the index
-- alone. The new index is built before the old one goes, so ON CONFLICT
-- (tenant_id, key) always finds its arbiter, for this release and the one
-- before (an index's INCLUDE columns do not change what it infers). The
-- build holds writes to the table (keyed commands wait within their
-- lock_timeout and answer 409 in-flight past it), not reads, as in 015.
CREATE UNIQUE INDEX idempotency_keys_tenant_key_bytes ON idempotency_keys (tenant_id, key) INCLUDE (stored_bytes);
DROP INDEX idempotency_keys_tenant_key;

---- create above / drop below ----

CREATE UNIQUE INDEX idempotency_keys_tenant_key ON idempotency_keys (tenant_id, key);
DROP INDEX idempotency_keys_tenant_key_bytes;
