-- The approval console. A session is a sign-in with an approver or admin token: only the
-- SHA-256 of its random id is kept, with the hash of the token it was opened with (checked
-- again on every request, so a revoked token ends its sessions), its CSRF token, and its idle
-- and absolute expiry. Kept in the ledger so that every replica sharing it knows the session.
CREATE TABLE console_sessions (
    id_hash      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    token_hash   TEXT COLLATE "C" NOT NULL,
    csrf         TEXT COLLATE "C" NOT NULL,
    created_at   BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);

CREATE INDEX console_sessions_expires ON console_sessions (expires_at);

-- Client approval links: single-use, expiring, bound to one pending invocation of one
-- tenant. Only the SHA-256 of the link's secret is kept; `used_at` is set once, by the
-- conditional update that uses it.
CREATE TABLE client_links (
    hash          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    id            TEXT COLLATE "C" NOT NULL UNIQUE,
    tenant        TEXT COLLATE "C" NOT NULL REFERENCES tenants (id),
    invocation_id TEXT COLLATE "C" NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    used_at       BIGINT,
    used_decision TEXT COLLATE "C"
);

CREATE INDEX client_links_invocation ON client_links (tenant, invocation_id);
