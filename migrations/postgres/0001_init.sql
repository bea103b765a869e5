-- toolgate ledger schema for PostgreSQL: the same tables as the SQLite schema (migrations/sqlite,
-- 0001 to 0003 together), in PostgreSQL's types, for several gateway replicas sharing one
-- database.
--
-- Conventions: timestamps are BIGINT unix milliseconds (UTC); JSON values are TEXT holding
-- exactly the text that was written (audit payloads are hashed as text, so they must come back
-- byte for byte, which JSONB would not do); booleans are BOOLEAN; stable names (statuses,
-- roles, codes) are TEXT as the Rust types spell them. Text columns use the "C" collation:
-- ids sort bytewise, as on SQLite, whatever the database's locale (and compare faster).

CREATE TABLE tenants (
    id         TEXT COLLATE "C"   NOT NULL PRIMARY KEY,
    name       TEXT COLLATE "C"   NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE agents (
    tenant     TEXT COLLATE "C"   NOT NULL REFERENCES tenants (id),
    id         TEXT COLLATE "C"   NOT NULL,
    name       TEXT COLLATE "C"   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- Only the SHA-256 of a token is stored. `tenant` is NULL for admin tokens; `agent` binds an
-- agent token to one agent (MATCH SIMPLE skips the composite foreign key when agent is NULL).
CREATE TABLE api_tokens (
    id         TEXT COLLATE "C"    NOT NULL PRIMARY KEY,
    hash       TEXT COLLATE "C"    NOT NULL UNIQUE,
    role       TEXT COLLATE "C"    NOT NULL CHECK (role IN ('admin', 'agent', 'approver')),
    tenant     TEXT COLLATE "C"    REFERENCES tenants (id),
    agent      TEXT COLLATE "C",
    label      TEXT COLLATE "C"    NOT NULL,
    created_at BIGINT  NOT NULL,
    revoked    BOOLEAN NOT NULL DEFAULT FALSE,
    CHECK (agent IS NULL OR tenant IS NOT NULL),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, id)
);

CREATE INDEX api_tokens_tenant ON api_tokens (tenant);

-- A grant binds a tool to a whole tenant (agent IS NULL) or to one agent; each case has its
-- own partial unique index, and upserts name the matching one.
CREATE TABLE tool_permissions (
    tenant     TEXT COLLATE "C"    NOT NULL REFERENCES tenants (id),
    agent      TEXT COLLATE "C",
    tool       TEXT COLLATE "C"    NOT NULL,
    enabled    BOOLEAN NOT NULL,
    updated_at BIGINT  NOT NULL,
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, id)
);

CREATE UNIQUE INDEX tool_permissions_tenant_wide
    ON tool_permissions (tenant, tool) WHERE agent IS NULL;
CREATE UNIQUE INDEX tool_permissions_per_agent
    ON tool_permissions (tenant, agent, tool) WHERE agent IS NOT NULL;

CREATE TABLE feature_flags (
    tenant     TEXT COLLATE "C"    NOT NULL REFERENCES tenants (id),
    flag       TEXT COLLATE "C"    NOT NULL,
    enabled    BOOLEAN NOT NULL,
    updated_at BIGINT  NOT NULL,
    PRIMARY KEY (tenant, flag)
);

CREATE TABLE policy_sets (
    tenant     TEXT COLLATE "C"   NOT NULL REFERENCES tenants (id),
    version    BIGINT NOT NULL CHECK (version >= 1),
    text       TEXT COLLATE "C"   NOT NULL,
    created_by TEXT COLLATE "C"   NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, version)
);

CREATE TABLE runs (
    id                TEXT COLLATE "C"   NOT NULL PRIMARY KEY,
    tenant            TEXT COLLATE "C"   NOT NULL,
    agent             TEXT COLLATE "C"   NOT NULL,
    manifest          TEXT COLLATE "C"   NOT NULL, -- JSON array of tool names
    status            TEXT COLLATE "C"   NOT NULL CHECK (status IN ('active', 'waiting_approval', 'completed')),
    calls_used        BIGINT NOT NULL CHECK (calls_used >= 0),
    max_calls         BIGINT NOT NULL CHECK (max_calls >= 0),
    pending_approvals BIGINT NOT NULL CHECK (pending_approvals >= 0),
    created_at        BIGINT NOT NULL,
    -- The budget: a counted call that would exceed it is refused by this constraint.
    CONSTRAINT runs_budget CHECK (calls_used <= max_calls),
    UNIQUE (tenant, id),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, id)
);

-- `seq` is the insertion order; pages of a run's calls are ordered by it (through the
-- indexes below: `seq` alone is never looked up, so it has no index of its own). `owner` is the
-- gateway process that recorded the call (its instance key, also the key of the session-level
-- advisory lock that process holds while it lives): a call still `running` whose owner no
-- longer holds its lock was interrupted by a crash.
CREATE TABLE tool_calls (
    seq                BIGINT NOT NULL GENERATED ALWAYS AS IDENTITY,
    id                 TEXT COLLATE "C"   NOT NULL PRIMARY KEY,
    tenant             TEXT COLLATE "C"   NOT NULL,
    run                TEXT COLLATE "C"   NOT NULL,
    agent              TEXT COLLATE "C"   NOT NULL,
    tool               TEXT COLLATE "C"   NOT NULL,
    action             TEXT COLLATE "C",
    tool_use_id        TEXT COLLATE "C",
    correlation_id     TEXT COLLATE "C"   NOT NULL,
    status             TEXT COLLATE "C"   NOT NULL,
    args_hash          TEXT COLLATE "C"   NOT NULL,
    input_redacted     TEXT COLLATE "C"   NOT NULL, -- JSON
    output_redacted    TEXT COLLATE "C",            -- JSON
    error_code         TEXT COLLATE "C",
    error_text         TEXT COLLATE "C",
    policy_decision_id TEXT COLLATE "C",
    risk_level         TEXT COLLATE "C",
    duration_ms        BIGINT,
    attempts           BIGINT NOT NULL,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    owner              BIGINT NOT NULL,
    FOREIGN KEY (tenant, run) REFERENCES runs (tenant, id)
);

-- The runtime's idempotency key: one call per (run, tool_use_id).
CREATE UNIQUE INDEX tool_calls_run_tool_use_id
    ON tool_calls (run, tool_use_id) WHERE tool_use_id IS NOT NULL;
CREATE INDEX tool_calls_run ON tool_calls (run, seq);
-- Calls still `running`: only the handful in flight.
CREATE INDEX tool_calls_running ON tool_calls (owner, seq) WHERE status = 'running';

-- No foreign key to tool_calls: a decision is written in the same statement as its call and
-- never apart from it, and the check would cost a lookup per call on the hottest path.
CREATE TABLE policy_decisions (
    id             TEXT COLLATE "C"   NOT NULL PRIMARY KEY,
    tenant         TEXT COLLATE "C"   NOT NULL,
    tool_call_id   TEXT COLLATE "C"   NOT NULL,
    tool           TEXT COLLATE "C"   NOT NULL,
    decision       TEXT COLLATE "C"   NOT NULL,
    risk           TEXT COLLATE "C"   NOT NULL,
    policy_ids     TEXT COLLATE "C"   NOT NULL, -- JSON array of policy ids
    policy_version BIGINT NOT NULL,
    created_at     BIGINT NOT NULL
);

-- A suspended call. Claims are conditional updates naming the exact `version` observed.
-- `arguments` is kept only while the row is pending (NULL once resolved).
CREATE TABLE pending_invocations (
    id             TEXT COLLATE "C"   NOT NULL PRIMARY KEY,
    tenant         TEXT COLLATE "C"   NOT NULL,
    run            TEXT COLLATE "C"   NOT NULL,
    tool_call_id   TEXT COLLATE "C"   NOT NULL REFERENCES tool_calls (id),
    tool           TEXT COLLATE "C"   NOT NULL,
    arguments      TEXT COLLATE "C",            -- JSON
    args_hash      TEXT COLLATE "C"   NOT NULL,
    manifest       TEXT COLLATE "C"   NOT NULL, -- JSON array of tool names
    policy_version BIGINT NOT NULL,
    origin         TEXT COLLATE "C"   NOT NULL CHECK (origin IN ('APPROVAL_REQUIRED', 'POLICY_DENIED', 'EXECUTION_FAILED')),
    decision       TEXT COLLATE "C"   NOT NULL,
    state          TEXT COLLATE "C"   NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'continued')),
    version        BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    decided_by     TEXT COLLATE "C",
    reason         TEXT COLLATE "C",
    decided_at     BIGINT,
    FOREIGN KEY (tenant, run) REFERENCES runs (tenant, id)
);

CREATE INDEX pending_invocations_run ON pending_invocations (tenant, run, state);
CREATE INDEX pending_invocations_expiry ON pending_invocations (state, expires_at);

-- The audit trail: one hash chain per tenant. `seq` is the global insertion order; `chain_seq`
-- is the position in the tenant's chain, 1, 2, 3, ... without gaps. Appends of one tenant are
-- serialized by locking its `audit_heads` row, so `chain_seq` order is also commit order: a
-- reader's cursor never skips an event that commits later.
-- No foreign key to tenants: an event is appended only after its tenant's head row (which
-- references the tenant) has been locked, which already proves the tenant exists.
CREATE TABLE audit_events (
    seq          BIGINT NOT NULL GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant       TEXT COLLATE "C"   NOT NULL,
    chain_seq    BIGINT NOT NULL CHECK (chain_seq >= 1),
    kind         TEXT COLLATE "C"   NOT NULL,
    run          TEXT COLLATE "C",
    tool_call_id TEXT COLLATE "C",
    payload      TEXT COLLATE "C"   NOT NULL, -- JSON, exactly the text that was hashed
    at           BIGINT NOT NULL,
    prev_hash    TEXT COLLATE "C"   NOT NULL,
    hash         TEXT COLLATE "C"   NOT NULL,
    UNIQUE (tenant, chain_seq)
);

CREATE INDEX audit_events_run ON audit_events (tenant, run, chain_seq) WHERE run IS NOT NULL;

-- The newest event of each chain, created with its tenant (position 0, the genesis hash) and
-- moved in the same transaction as every append. Writers lock it (SELECT ... FOR UPDATE) before
-- appending, which is what orders one tenant's appends across replicas.
CREATE TABLE audit_heads (
    tenant    TEXT COLLATE "C"   NOT NULL PRIMARY KEY REFERENCES tenants (id),
    chain_seq BIGINT NOT NULL CHECK (chain_seq >= 0),
    hash      TEXT COLLATE "C"   NOT NULL
);

-- Tenant credentials for connectors: sealed (AES-256-GCM ciphertext `tgs1.<key id>.<base64>`,
-- `key_id` names the master key, never stored here) or a reference (`env:NAME`, `file:/path`).
CREATE TABLE tenant_tool_secrets (
    tenant     TEXT COLLATE "C"   NOT NULL REFERENCES tenants (id),
    name       TEXT COLLATE "C"   NOT NULL,
    kind       TEXT COLLATE "C"   NOT NULL CHECK (kind IN ('sealed', 'reference')),
    value      TEXT COLLATE "C"   NOT NULL,
    key_id     TEXT COLLATE "C",
    metadata   TEXT COLLATE "C"   NOT NULL DEFAULT '{}', -- JSON object, never secret material
    notes      TEXT COLLATE "C"   NOT NULL DEFAULT '',
    created_by TEXT COLLATE "C"   NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, name),
    CHECK ((kind = 'sealed') = (key_id IS NOT NULL))
);

CREATE INDEX tenant_tool_secrets_key ON tenant_tool_secrets (key_id) WHERE key_id IS NOT NULL;

-- Audit events are append-only and chain heads only move forward. These triggers stop every
-- such change through SQL, including the ledger's own code. They are not a security boundary
-- (a database owner can drop them); the hash chain plus `audit_heads` makes tampering evident
-- to verification.
CREATE FUNCTION toolgate_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'integrity_constraint_violation';
END
$$;

-- Aborts the statement it is called from unless `ok`: how the writer's one-statement batch
-- refuses to commit when a chain head moved under it (another replica appended first).
CREATE FUNCTION toolgate_check(ok boolean, message text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION '%', message USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN true;
END
$$;

CREATE TRIGGER audit_events_no_update BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION toolgate_refuse('audit events are append-only');
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_refuse('audit events are append-only');
CREATE TRIGGER audit_heads_forward_only BEFORE UPDATE ON audit_heads
    FOR EACH ROW WHEN (NEW.chain_seq < OLD.chain_seq OR NEW.tenant <> OLD.tenant)
    EXECUTE FUNCTION toolgate_refuse('audit chain heads only move forward');
CREATE TRIGGER audit_heads_no_delete BEFORE DELETE ON audit_heads
    FOR EACH ROW EXECUTE FUNCTION toolgate_refuse('audit chain heads cannot be removed');
CREATE TRIGGER audit_heads_no_truncate BEFORE TRUNCATE ON audit_heads
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_refuse('audit chain heads cannot be removed');
