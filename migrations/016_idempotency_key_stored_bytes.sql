-- A tenant's key storage is bounded in bytes as well as in keys (G9). A
-- key's row keeps its canonical request and its response, so a legal row
-- takes from a few hundred bytes to about 19 KB (a create of 100 items
-- with long SKUs, stored and answered): a quota of keys alone let one
-- tenant store 27 times what it budgets. stored_bytes is what the row
-- keeps of the request and the response, written by the api with the row;
-- each api recounts a tenant's keys and their bytes (command/key_quota.go)
-- from the unique index, which now carries it, without reading the table.
--
-- Expand only: a row an older api writes during a rolling deploy has NULL,
-- counted as no bytes (its key still counts). The new index is built
-- before the old one goes, so ON CONFLICT (tenant_id, key) always finds
-- its arbiter. Building it holds writes to the table for as long as the
-- build takes, as in 015.
ALTER TABLE idempotency_keys ADD COLUMN stored_bytes integer;

UPDATE idempotency_keys
SET stored_bytes = octet_length(request::text) + coalesce(octet_length(response_headers::text), 0)
                 + coalesce(octet_length(response_body), 0);

CREATE UNIQUE INDEX idempotency_keys_tenant_key_bytes ON idempotency_keys (tenant_id, key) INCLUDE (stored_bytes);
DROP INDEX idempotency_keys_tenant_key;

---- create above / drop below ----

CREATE UNIQUE INDEX idempotency_keys_tenant_key ON idempotency_keys (tenant_id, key);
DROP INDEX idempotency_keys_tenant_key_bytes;
ALTER TABLE idempotency_keys DROP COLUMN stored_bytes;
