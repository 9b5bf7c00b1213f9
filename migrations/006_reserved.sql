-- Reserved for a migration of another branch (tern refuses gaps in the
-- numbering). Delete this file when the branches are merged.
SELECT 1;

---- create above / drop below ----

SELECT 1;
