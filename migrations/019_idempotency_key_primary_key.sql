-- Contract step of 015: the primary key of a key row becomes (tenant_id,
-- key), the unique index the api has claimed keys on since 015, and the
-- old primary key (tenant_id, scope, key) goes. Two unique indexes on one
-- key raced: ON CONFLICT (tenant_id, key) names only one arbiter, so of
-- two concurrent first uses of a key, the second, having passed the
-- arbiter's pre-check, waited on the first's entry in the other index and
-- then failed with a unique violation instead of doing nothing: a 500 for
-- an honest concurrent retry of a pay, ship, cancel or update (about one
-- key in eight when four copies race). One index fewer is also one index
-- entry fewer per keyed command.
--
-- Instant: the index exists (017) and its columns are NOT NULL, so the
-- new primary key takes it over (renamed idempotency_keys_pkey) without a
-- scan; the lock is held for no time. Apis of releases 015 to 018 claim
-- on (tenant_id, key), which this key is; an api older than 015 (it
-- claimed on (tenant_id, scope, key)) must not run beside this one.
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_pkey,
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY USING INDEX idempotency_keys_tenant_key_bytes;

---- create above / drop below ----

ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
CREATE UNIQUE INDEX idempotency_keys_tenant_key_bytes ON idempotency_keys (tenant_id, key) INCLUDE (stored_bytes);
ALTER TABLE idempotency_keys ADD PRIMARY KEY (tenant_id, scope, key);
