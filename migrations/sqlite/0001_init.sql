-- toolgate ledger schema for SQLite.
--
-- Conventions: timestamps are INTEGER unix milliseconds (UTC); JSON values are TEXT; booleans
-- are INTEGER 0/1; stable names (statuses, roles, codes) are TEXT as the Rust types spell them.
-- Every table is STRICT so a wrongly typed value is refused rather than silently coerced.

CREATE TABLE tenants (
    id         TEXT    NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE agents (
    tenant     TEXT    NOT NULL REFERENCES tenants (id),
    id         TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
) STRICT;

-- Only the SHA-256 of a token is stored. `tenant` is NULL for admin tokens; `agent` binds an
-- agent token to one agent (the composite foreign key is skipped by SQLite when agent is NULL).
CREATE TABLE api_tokens (
    id         TEXT    NOT NULL PRIMARY KEY,
    hash       TEXT    NOT NULL UNIQUE,
    role       TEXT    NOT NULL CHECK (role IN ('admin', 'agent', 'approver')),
    tenant     TEXT    REFERENCES tenants (id),
    agent      TEXT,
    label      TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    revoked    INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1)),
    CHECK (agent IS NULL OR tenant IS NOT NULL),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, id)
) STRICT;

CREATE INDEX api_tokens_tenant ON api_tokens (tenant);

-- A grant binds a tool to a whole tenant (agent IS NULL) or to one agent. A UNIQUE constraint
-- over a NULL column would let tenant-wide grants repeat, so each case has its own partial
-- unique index, and upserts name the matching one.
CREATE TABLE tool_permissions (
    tenant     TEXT    NOT NULL REFERENCES tenants (id),
    agent      TEXT,
    tool       TEXT    NOT NULL,
    enabled    INTEGER NOT NULL CHECK (enabled IN (0, 1)),
    updated_at INTEGER NOT NULL,
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, id)
) STRICT;

CREATE UNIQUE INDEX tool_permissions_tenant_wide
    ON tool_permissions (tenant, tool) WHERE agent IS NULL;
CREATE UNIQUE INDEX tool_permissions_per_agent
    ON tool_permissions (tenant, agent, tool) WHERE agent IS NOT NULL;

CREATE TABLE feature_flags (
    tenant     TEXT    NOT NULL REFERENCES tenants (id),
    flag       TEXT    NOT NULL,
    enabled    INTEGER NOT NULL CHECK (enabled IN (0, 1)),
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, flag)
) STRICT;

CREATE TABLE policy_sets (
    tenant     TEXT    NOT NULL REFERENCES tenants (id),
    version    INTEGER NOT NULL CHECK (version >= 1),
    text       TEXT    NOT NULL,
    created_by TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, version)
) STRICT;

-- Run ids are globally unique; queries still always filter by tenant, and the (tenant, id)
-- key lets calls and pending invocations reference a run of their own tenant only.
CREATE TABLE runs (
    id                TEXT    NOT NULL PRIMARY KEY,
    tenant            TEXT    NOT NULL,
    agent             TEXT    NOT NULL,
    manifest          TEXT    NOT NULL, -- JSON array of tool names
    status            TEXT    NOT NULL CHECK (status IN ('active', 'waiting_approval', 'completed')),
    calls_used        INTEGER NOT NULL CHECK (calls_used >= 0),
    max_calls         INTEGER NOT NULL CHECK (max_calls >= 0),
    pending_approvals INTEGER NOT NULL CHECK (pending_approvals >= 0),
    created_at        INTEGER NOT NULL,
    -- The budget: a counted call that would exceed it is refused by this constraint.
    CONSTRAINT runs_budget CHECK (calls_used <= max_calls),
    UNIQUE (tenant, id),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, id)
) STRICT;

-- `seq` is the insertion order (stable, unlike an implicit rowid, across VACUUM); pages of a
-- run's calls are ordered by it.
CREATE TABLE tool_calls (
    seq                INTEGER NOT NULL PRIMARY KEY,
    id                 TEXT    NOT NULL UNIQUE,
    tenant             TEXT    NOT NULL,
    run                TEXT    NOT NULL,
    agent              TEXT    NOT NULL,
    tool               TEXT    NOT NULL,
    action             TEXT,
    tool_use_id        TEXT,
    correlation_id     TEXT    NOT NULL,
    status             TEXT    NOT NULL,
    args_hash          TEXT    NOT NULL,
    input_redacted     TEXT    NOT NULL, -- JSON
    output_redacted    TEXT,             -- JSON
    error_code         TEXT,
    error_text         TEXT,
    policy_decision_id TEXT,
    risk_level         TEXT,
    duration_ms        INTEGER,
    attempts           INTEGER NOT NULL,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    FOREIGN KEY (tenant, run) REFERENCES runs (tenant, id)
) STRICT;

-- The runtime's idempotency key: one call per (run, tool_use_id).
CREATE UNIQUE INDEX tool_calls_run_tool_use_id
    ON tool_calls (run, tool_use_id) WHERE tool_use_id IS NOT NULL;
-- A run's calls in insertion order (the index implicitly ends with seq).
CREATE INDEX tool_calls_run ON tool_calls (run);

-- Calls still `running`: at start-up these are the calls a crash interrupted. Partial, so it
-- holds only the handful in flight.
CREATE INDEX tool_calls_running ON tool_calls (seq) WHERE status = 'running';

CREATE TABLE policy_decisions (
    id             TEXT    NOT NULL PRIMARY KEY,
    tenant         TEXT    NOT NULL,
    tool_call_id   TEXT    NOT NULL REFERENCES tool_calls (id),
    tool           TEXT    NOT NULL,
    decision       TEXT    NOT NULL,
    risk           TEXT    NOT NULL,
    policy_ids     TEXT    NOT NULL, -- JSON array of policy ids
    policy_version INTEGER NOT NULL,
    created_at     INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Decisions are reached from their call (tool_calls.policy_decision_id), never the other way,
-- and calls are never deleted, so the foreign key needs no index on tool_call_id: one B-tree
-- less to write on every call.

-- A suspended call. Claims are conditional updates naming the exact `version` observed.
-- `arguments` is kept only while the row is pending (NULL once resolved).
CREATE TABLE pending_invocations (
    id             TEXT    NOT NULL PRIMARY KEY,
    tenant         TEXT    NOT NULL,
    run            TEXT    NOT NULL,
    tool_call_id   TEXT    NOT NULL REFERENCES tool_calls (id),
    tool           TEXT    NOT NULL,
    arguments      TEXT,             -- JSON
    args_hash      TEXT    NOT NULL,
    manifest       TEXT    NOT NULL, -- JSON array of tool names
    policy_version INTEGER NOT NULL,
    origin         TEXT    NOT NULL CHECK (origin IN ('APPROVAL_REQUIRED', 'POLICY_DENIED', 'EXECUTION_FAILED')),
    decision       TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('pending', 'approved', 'rejected')),
    version        INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    FOREIGN KEY (tenant, run) REFERENCES runs (tenant, id)
) STRICT;

CREATE INDEX pending_invocations_run ON pending_invocations (tenant, run, state);
CREATE INDEX pending_invocations_expiry ON pending_invocations (state, expires_at);

-- The audit trail: one hash chain per tenant. `seq` is the global insertion order (no
-- AUTOINCREMENT: rows are never deleted, and AUTOINCREMENT costs a write of sqlite_sequence on
-- every append); `chain_seq` is the position in the tenant's chain, 1, 2, 3, ... without gaps.
CREATE TABLE audit_events (
    seq          INTEGER NOT NULL PRIMARY KEY,
    tenant       TEXT    NOT NULL REFERENCES tenants (id),
    chain_seq    INTEGER NOT NULL CHECK (chain_seq >= 1),
    kind         TEXT    NOT NULL,
    run          TEXT,
    tool_call_id TEXT,
    payload      TEXT    NOT NULL, -- JSON, exactly the text that was hashed
    at           INTEGER NOT NULL,
    prev_hash    TEXT    NOT NULL,
    hash         TEXT    NOT NULL,
    UNIQUE (tenant, chain_seq)
) STRICT;

-- The newest event of each chain, written in the same transaction as every append. Without it,
-- removing the newest events of a chain would leave a shorter chain that still verifies.
CREATE TABLE audit_heads (
    tenant    TEXT    NOT NULL PRIMARY KEY REFERENCES tenants (id),
    chain_seq INTEGER NOT NULL CHECK (chain_seq >= 1),
    hash      TEXT    NOT NULL
) STRICT;

-- Audit events are append-only. These triggers stop every UPDATE and DELETE through SQL,
-- including the ledger's own code. They are not a security boundary: someone with write access
-- to the file can drop them (the tamper tests do exactly that to model such an attacker), and
-- the hash chain plus `audit_heads` is what makes such tampering evident to `verify_chains`.
CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit events are append-only');
END;

CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit events are append-only');
END;

-- A chain head only moves forward and is never removed.
CREATE TRIGGER audit_heads_forward_only BEFORE UPDATE ON audit_heads
WHEN NEW.chain_seq < OLD.chain_seq OR NEW.tenant <> OLD.tenant
BEGIN
    SELECT RAISE(ABORT, 'audit chain heads only move forward');
END;

CREATE TRIGGER audit_heads_no_delete BEFORE DELETE ON audit_heads
BEGIN
    SELECT RAISE(ABORT, 'audit chain heads cannot be removed');
END;
