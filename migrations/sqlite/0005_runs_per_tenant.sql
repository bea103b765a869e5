-- no-transaction
-- Run ids are unique per tenant, not globally: another tenant's run id must behave exactly
-- like a free one. SQLite cannot change a primary key, so `runs` is rebuilt with the same
-- columns, rows and constraints, keyed by (tenant, id). `tool_calls` and
-- `pending_invocations` reference runs by (tenant, id) already; foreign keys are off while the
-- parent table is swapped (the documented procedure: a DROP of a referenced table would
-- otherwise fail), then checked before the commit. The idempotency key of a call becomes
-- (tenant, run, tool_use_id) for the same reason (indexed run first, as on PostgreSQL, where
-- an index led by `tenant` misled the writer's plans).
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

CREATE TABLE runs_new (
    id                TEXT    NOT NULL,
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
    PRIMARY KEY (tenant, id),
    FOREIGN KEY (tenant, agent) REFERENCES agents (tenant, id)
) STRICT;

INSERT INTO runs_new (id, tenant, agent, manifest, status, calls_used, max_calls,
    pending_approvals, created_at)
SELECT id, tenant, agent, manifest, status, calls_used, max_calls, pending_approvals, created_at
FROM runs;

DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;

DROP INDEX tool_calls_run_tool_use_id;
CREATE UNIQUE INDEX tool_calls_run_tool_use_id
    ON tool_calls (run, tenant, tool_use_id) WHERE tool_use_id IS NOT NULL;
DROP INDEX tool_calls_run;
CREATE INDEX tool_calls_run ON tool_calls (run, tenant);

COMMIT;
PRAGMA foreign_keys = ON;
