-- Parked events that a re-drive applied stay in dead_letters as 'retried'
-- rows, payload and all. Under load a tenant past its share of a
-- projection's window parks its delayed events by the thousand, so these
-- rows grew without bound. Each projector now deletes a projection's
-- retried rows once they were resolved longer ago than its inbox
-- retention (projection/inbox_prune.go); this index gives that sweep its
-- range, oldest first, without reading the open, parked or discarded rows.
-- Discarded rows stay: a rebuild reads them to skip what an operator
-- discarded.
CREATE INDEX dead_letters_retried ON dead_letters (projection, resolved_at) WHERE status = 'retried';

---- create above / drop below ----

DROP INDEX dead_letters_retried;
