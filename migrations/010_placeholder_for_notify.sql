-- A placeholder for migration 010, which branch h/notify adds (it drops the
-- outbox NOTIFY trigger). tern refuses a gap in the numbers, and this branch
-- was given 011; drop this file when merging h/notify's 010.
SELECT 1;

---- create above / drop below ----

SELECT 1;
