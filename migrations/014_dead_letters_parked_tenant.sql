-- The payment worker parks a tenant's excess intents in dead_letters
-- (settle/park.go) and re-drives them per tenant: its oldest due ones, as
-- many as it has free slots. This index lists the tenants with parked
-- rows by a skip scan (one probe per tenant, however many rows each
-- parked) and reads each tenant's due rows in due order, so a hostile
-- tenant's hundred thousand parked intents cost another tenant nothing.
CREATE INDEX dead_letters_parked_tenant ON dead_letters (projection, tenant_id, next_attempt_at)
    WHERE status = 'parked';

---- create above / drop below ----

DROP INDEX dead_letters_parked_tenant;
