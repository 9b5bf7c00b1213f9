-- Tokens that can be revoked and expire, and that carry a checksum.
-- expires_at (NULL: never) and revoked_at (NULL: live) are judged by the
-- database clock at look-up.
-- format is 2 for tokens with a CRC32 checksum (ord_ + 43 base62 + 6 base62)
-- and 1 for the older tokens without one, which the api refuses unless
-- -accept-legacy-tokens is on.
ALTER TABLE api_clients
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN revoked_at timestamptz,
    ADD COLUMN format     smallint    NOT NULL DEFAULT 1;
ALTER TABLE api_clients ALTER COLUMN format SET DEFAULT 2;

---- create above / drop below ----

ALTER TABLE api_clients
    DROP COLUMN expires_at, DROP COLUMN revoked_at, DROP COLUMN format;
