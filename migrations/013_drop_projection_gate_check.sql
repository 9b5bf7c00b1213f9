-- Commit 1b18d7a's migration 013 created projection_gate_check(), which a
-- one-round-trip projection batch raised from; the batch is now two round
-- trips that never raise (projection/gate.go, commitPipelined), and the
-- function is gone. A database migrated at 1b18d7a drops it here; any
-- other has nothing to drop.
DROP FUNCTION IF EXISTS projection_gate_check(boolean, text);

---- create above / drop below ----

-- Nothing to restore: no version of the code calls the function.
