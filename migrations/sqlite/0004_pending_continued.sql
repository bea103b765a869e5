-- A pending invocation can also be resolved without executing ('continued': the run moves on).
-- SQLite cannot alter a CHECK constraint, so the table is rebuilt with the same columns, rows
-- and indexes. Nothing references pending_invocations, so dropping the old table is safe.
CREATE TABLE pending_invocations_new (
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
    state          TEXT    NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'continued')),
    version        INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    decided_by     TEXT,
    reason         TEXT,
    decided_at     INTEGER,
    FOREIGN KEY (tenant, run) REFERENCES runs (tenant, id)
) STRICT;

INSERT INTO pending_invocations_new (id, tenant, run, tool_call_id, tool, arguments, args_hash,
    manifest, policy_version, origin, decision, state, version, expires_at, created_at,
    decided_by, reason, decided_at)
SELECT id, tenant, run, tool_call_id, tool, arguments, args_hash, manifest, policy_version,
    origin, decision, state, version, expires_at, created_at, decided_by, reason, decided_at
FROM pending_invocations;

DROP TABLE pending_invocations;
ALTER TABLE pending_invocations_new RENAME TO pending_invocations;

CREATE INDEX pending_invocations_run ON pending_invocations (tenant, run, state);
CREATE INDEX pending_invocations_expiry ON pending_invocations (state, expires_at);
