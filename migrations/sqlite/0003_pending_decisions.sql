-- Who decided a pending invocation, why and when. A decision moves `state` away from
-- 'pending' and bumps `version` in the same conditional UPDATE that claims the row.
ALTER TABLE pending_invocations ADD COLUMN decided_by TEXT;
ALTER TABLE pending_invocations ADD COLUMN reason TEXT;
ALTER TABLE pending_invocations ADD COLUMN decided_at INTEGER;
