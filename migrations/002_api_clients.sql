-- Callers and their tenants. A token is shown once, when created; only its
-- SHA-256 is kept, so a leaked table does not leak working tokens.
CREATE TABLE api_clients (
    token_hash bytea       PRIMARY KEY,
    tenant_id  text        NOT NULL,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_clients_tenant_id ON api_clients (tenant_id);

---- create above / drop below ----

DROP TABLE api_clients;
