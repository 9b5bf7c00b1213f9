-- When the projector re-drives a parked dead letter next. NULL: not on a
-- clock; it waits behind an open dead letter of an earlier version of its
-- order, and `dead-letters retry|discard` (or the re-drive that applies
-- that version) makes it due. The partial index lets each re-drive read
-- only the due rows, in due order, however many parked rows wait;
-- created_at means "created" again (it was overwritten on each re-park).
ALTER TABLE dead_letters ADD COLUMN next_attempt_at timestamptz;
UPDATE dead_letters SET next_attempt_at = created_at
WHERE status = 'parked'
  AND NOT EXISTS (SELECT 1 FROM dead_letters o
                  WHERE o.projection = dead_letters.projection AND o.aggregate_id = dead_letters.aggregate_id
                    AND o.status = 'open' AND o.aggregate_version < dead_letters.aggregate_version);
CREATE INDEX dead_letters_parked_due ON dead_letters (projection, next_attempt_at)
    WHERE status = 'parked';

---- create above / drop below ----

DROP INDEX dead_letters_parked_due;
ALTER TABLE dead_letters DROP COLUMN next_attempt_at;
