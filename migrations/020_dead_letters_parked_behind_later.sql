-- Until now an event that came late behind an open dead letter of a LATER
-- version of its order was parked behind it, with no next attempt: once
-- its own predecessor was applied it was next in line, yet out of reach
-- (retry of the later one found a gap, discard of it was refused as not
-- next). An open dead letter now holds back only later versions. Make the
-- rows that no open dead letter of an earlier version holds back due now:
-- the re-drive applies each, or parks it again on a clock. (Only the
-- projector parks rows without a next attempt; the payment worker's
-- parked rows always have one.)
UPDATE dead_letters SET next_attempt_at = now()
WHERE status = 'parked' AND next_attempt_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM dead_letters o
                  WHERE o.projection = dead_letters.projection AND o.aggregate_id = dead_letters.aggregate_id
                    AND o.tenant_id = dead_letters.tenant_id
                    AND o.status = 'open' AND o.aggregate_version < dead_letters.aggregate_version);

---- create above / drop below ----

-- Nothing to undo: the rows were made due, and the re-drive has applied or
-- parked them again since.
SELECT 1;
