-- An Idempotency-Key names one request of its tenant, whatever its route
-- (G3): the same key on another method or route is refused with 422, as
-- with another body. Until now the key was per (tenant, scope, key), scope
-- being the method and route template, so the same key on another route
-- was another key and ran. The scope stays in the row (the route the key
-- was first used on, and part of the fingerprint); the primary key drops
-- it.
--
-- A key a tenant already used on more than one route keeps its oldest
-- row; each later one is renamed apart (a newline and its scope appended,
-- which no Idempotency-Key header can carry), so it is never replayed
-- again, and a retry of it is refused as a reuse of the oldest.
UPDATE idempotency_keys k
SET key = k.key || E'\n' || k.scope
WHERE EXISTS (SELECT 1 FROM idempotency_keys o
              WHERE o.tenant_id = k.tenant_id AND o.key = k.key
                AND (o.created_at, o.scope) < (k.created_at, k.scope));

ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_pkey,
    ADD PRIMARY KEY (tenant_id, key);

---- create above / drop below ----

ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_pkey,
    ADD PRIMARY KEY (tenant_id, scope, key);

UPDATE idempotency_keys SET key = split_part(key, E'\n', 1) WHERE key LIKE E'%\n%';
