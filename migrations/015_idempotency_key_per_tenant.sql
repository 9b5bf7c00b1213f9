-- An Idempotency-Key names one request of its tenant, whatever its route
-- (G3): the same key on another method or route is refused with 422, as
-- with another body. Until now a key was unique per (tenant, scope, key),
-- scope being the method and route template, so the same key on another
-- route was another key, and ran. The scope stays in the row (the route
-- the key was first used on, and part of the fingerprint).
--
-- Expand only: the primary key (tenant_id, scope, key) stays, so an api of
-- the release before this one, running beside a new one during a rolling
-- deploy, still finds the arbiter of its ON CONFLICT (tenant_id, scope,
-- key); the new code claims on (tenant_id, key). A later migration drops
-- the old key once no older api runs. Building the index holds writes to
-- the table (keyed commands wait, within their lock_timeout, and answer
-- 409 in-flight past it) for as long as the build takes.
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

CREATE UNIQUE INDEX idempotency_keys_tenant_key ON idempotency_keys (tenant_id, key);

---- create above / drop below ----

DROP INDEX idempotency_keys_tenant_key;

-- A renamed row whose old name was taken again since (its oldest row
-- expired, and the key was used anew on its route) is the older of the two:
-- it goes, and the rest get their names back.
DELETE FROM idempotency_keys r
WHERE r.key LIKE E'%\n%'
  AND EXISTS (SELECT 1 FROM idempotency_keys o
              WHERE o.tenant_id = r.tenant_id AND o.scope = r.scope AND o.key = split_part(r.key, E'\n', 1));
UPDATE idempotency_keys SET key = split_part(key, E'\n', 1) WHERE key LIKE E'%\n%';
