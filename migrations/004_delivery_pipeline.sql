-- Production delivery: relay partitions and order, dead letters, rebuilds.

-- seq orders the outbox: a sequence value is taken at insert, and an
-- aggregate's next event is inserted only after its previous one committed
-- (under the order's row lock), so per aggregate, seq follows version.
-- partition spreads aggregates over 16 relay partitions; one relay at a time
-- owns a partition (an advisory lock), so an aggregate's events leave in order.
ALTER TABLE outbox
    ADD COLUMN seq bigserial,
    ADD COLUMN partition smallint NOT NULL
        GENERATED ALWAYS AS (get_byte(uuid_send(aggregate_id), 15) % 16) STORED;
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (partition, seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;
CREATE UNIQUE INDEX outbox_seq ON outbox (seq);

-- Events a projection could not apply (status 'open'), and the later events
-- of the same aggregate held back behind them (status 'parked'), with the raw
-- message. `projector dead-letters` lists, retries and discards them.
CREATE TABLE dead_letters (
    id                bigserial   PRIMARY KEY,
    projection        text        NOT NULL,
    tenant_id         text,                 -- NULL when the message is not an event at all
    event_id          uuid,
    aggregate_id      uuid,
    aggregate_version bigint,
    stream_seq        bigint      NOT NULL,
    subject           text        NOT NULL,
    payload           bytea       NOT NULL,
    error             text        NOT NULL,
    deliveries        integer     NOT NULL,
    status            text        NOT NULL CHECK (status IN ('open', 'parked', 'retried', 'discarded')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    resolved_at       timestamptz
);
CREATE INDEX dead_letters_unresolved ON dead_letters (projection, aggregate_id, aggregate_version)
    WHERE status IN ('open', 'parked');

---- create above / drop below ----

DROP TABLE dead_letters;
DROP INDEX outbox_seq;
DROP INDEX outbox_published_at;
DROP INDEX outbox_unpublished;
ALTER TABLE outbox DROP COLUMN partition, DROP COLUMN seq;
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
