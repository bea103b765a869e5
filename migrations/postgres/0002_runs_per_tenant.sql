-- Run ids are unique per tenant, not globally: another tenant's run id must behave exactly
-- like a free one. The primary key becomes (tenant, id) (the UNIQUE (tenant, id) constraint
-- that calls and pending invocations reference stays), and a call's idempotency key becomes
-- (tenant, run, tool_use_id).
--
-- The call indexes lead with `run`, never with `tenant`: the writer's generic plans would
-- otherwise take an index whose first column is `tenant` to find one call by id (a scan of
-- every call of the tenant, per batch, that grows with the ledger), instead of the key.
ALTER TABLE runs DROP CONSTRAINT runs_pkey;
ALTER TABLE runs ADD PRIMARY KEY (tenant, id);

DROP INDEX tool_calls_run_tool_use_id;
CREATE UNIQUE INDEX tool_calls_run_tool_use_id
    ON tool_calls (run, tenant, tool_use_id) WHERE tool_use_id IS NOT NULL;
DROP INDEX tool_calls_run;
CREATE INDEX tool_calls_run ON tool_calls (run, tenant, seq);
