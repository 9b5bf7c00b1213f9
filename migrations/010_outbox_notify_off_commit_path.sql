-- No NOTIFY inside a write transaction (issue #12): a transaction that sent
-- NOTIFY takes a cluster-wide lock in its pre-commit step and holds it
-- through its WAL flush, so the outbox_notify trigger made every create
-- commit one at a time. The relay in the api process is now woken by an
-- in-process signal after the commit; other writers (the payment worker)
-- send one coalesced NOTIFY outbox after their commits (postgres.Notifier),
-- and every relay polls as a fallback.
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();

---- create above / drop below ----

CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
