-- The payment worker parks a tenant's excess intents in dead_letters
-- (settle/park.go) and re-drives them per tenant: its oldest due ones, as
-- many as it has free slots. This index lists the tenants with parked
-- rows by a skip scan (one probe per tenant, however many rows each
-- parked), finds each one's earliest due time in one probe, and reads its
-- due rows in due order, so one tenant's many parked intents cost another
-- tenant little.
--
-- attempts counts a parked intent's attempts that may have reached the
-- provider (a lease adds one before the call; the re-drive looks the
-- charge up by key first when an earlier one may have), apart from
-- deliveries, its failed deliveries, which -max-deliver bounds.
ALTER TABLE dead_letters ADD COLUMN attempts integer NOT NULL DEFAULT 0;
CREATE INDEX dead_letters_parked_tenant ON dead_letters (projection, tenant_id, next_attempt_at)
    WHERE status = 'parked';

---- create above / drop below ----

DROP INDEX dead_letters_parked_tenant;
ALTER TABLE dead_letters DROP COLUMN attempts;
