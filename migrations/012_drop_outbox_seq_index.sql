-- outbox_seq (a unique index on seq) earned nothing: seq comes from its own
-- sequence, and the one query that orders by seq, the relay's claim, walks
-- outbox_unpublished (partition, seq). Every event still paid an insert into
-- it, at its right-most page, where all concurrent creates insert (#12).
DROP INDEX outbox_seq;

---- create above / drop below ----

CREATE UNIQUE INDEX outbox_seq ON outbox (seq);
