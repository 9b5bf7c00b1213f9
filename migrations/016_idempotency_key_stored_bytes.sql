-- A tenant's key storage is bounded in bytes as well as in keys (G9). A
-- key's row keeps its canonical request and its response, so a legal row
-- takes from a few hundred bytes to about 19 KB (a create of 100 items
-- with long SKUs, stored and answered): a quota of keys alone let one
-- tenant store 27 times what it budgets. stored_bytes is what the row
-- keeps of the request and the response, written by the api with the row;
-- each api recounts a tenant's keys and their bytes (command/key_quota.go)
-- from the unique index, which carries it from 017 on.
--
-- Expand only, and instant: a nullable column without a default rewrites
-- nothing, so its lock is held for no time. Rows already stored, and rows
-- an older api writes during a rolling deploy, have NULL, counted as no
-- bytes (their keys still count) until they expire with their key
-- (24 h by default); nothing is backfilled in this transaction, which
-- would hold the table, reads included, for a rewrite of every row.
ALTER TABLE idempotency_keys ADD COLUMN stored_bytes integer;

---- create above / drop below ----

ALTER TABLE idempotency_keys DROP COLUMN stored_bytes;
