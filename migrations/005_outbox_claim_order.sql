-- The relay claims unpublished rows in seq order across the partitions it
-- owns: an index on seq (of unpublished rows only) gives that order without
-- sorting the whole backlog on every claim.
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

---- create above / drop below ----

DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (partition, seq) WHERE published_at IS NULL;
