-- The per-call timeout the agent asked for, kept with a suspended call so the approved
-- execution runs under it (still bounded by the gateway's maximum). NULL: the tool's default,
-- which is what every row written before this column existed had.
ALTER TABLE pending_invocations ADD COLUMN timeout_ms INTEGER CHECK (timeout_ms IS NULL OR timeout_ms > 0);
