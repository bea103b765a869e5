-- The approval console. A session is a sign-in with an approver or admin token: only the
-- SHA-256 of its random id is kept, with the hash of the token it was opened with (checked
-- again on every request, so a revoked token ends its sessions), its CSRF token, and its idle
-- and absolute expiry. Kept in the ledger so that every replica sharing it knows the session.
CREATE TABLE console_sessions (
    id_hash      TEXT    NOT NULL PRIMARY KEY,
    token_hash   TEXT    NOT NULL,
    csrf         TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT;

CREATE INDEX console_sessions_expires ON console_sessions (expires_at);

-- Client approval links: single-use, expiring, bound to one pending invocation of one
-- tenant. Only the SHA-256 of the link's secret is kept; `used_at` is set once, by the
-- conditional update that uses it.
CREATE TABLE client_links (
    hash          TEXT    NOT NULL PRIMARY KEY,
    id            TEXT    NOT NULL UNIQUE,
    tenant        TEXT    NOT NULL REFERENCES tenants (id),
    invocation_id TEXT    NOT NULL,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    used_at       INTEGER,
    used_decision TEXT
) STRICT;

CREATE INDEX client_links_invocation ON client_links (tenant, invocation_id);
