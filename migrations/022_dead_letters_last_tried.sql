-- When the payment worker last may have called the provider with a dead
-- letter's key: when it was opened (a parked intent opens after its last
-- try, long after its row was written) and when an operator's retry starts.
-- A discard looks the key up at the provider, whose search may miss a
-- charge younger than a minute; it waits that long after this, not after
-- created_at. NULL: created_at (the row was written right after the call).
ALTER TABLE dead_letters ADD COLUMN last_tried_at timestamptz;

---- create above / drop below ----

ALTER TABLE dead_letters DROP COLUMN last_tried_at;
