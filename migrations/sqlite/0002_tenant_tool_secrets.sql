-- Tenant credentials for connectors. A row is either sealed (`value` is the AES-256-GCM
-- ciphertext `tgs1.<key id>.<base64>`, `key_id` names the master key; master keys are never
-- stored here) or a reference (`value` is `env:NAME` or `file:/path`, read at use).
CREATE TABLE tenant_tool_secrets (
    tenant     TEXT    NOT NULL REFERENCES tenants (id),
    name       TEXT    NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('sealed', 'reference')),
    value      TEXT    NOT NULL,
    key_id     TEXT,
    metadata   TEXT    NOT NULL DEFAULT '{}', -- JSON object, never secret material
    notes      TEXT    NOT NULL DEFAULT '',
    created_by TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name),
    CHECK ((kind = 'sealed') = (key_id IS NOT NULL))
) STRICT;

-- Rewrap and key retirement look credentials up by the key that sealed them.
CREATE INDEX tenant_tool_secrets_key ON tenant_tool_secrets (key_id) WHERE key_id IS NOT NULL;
