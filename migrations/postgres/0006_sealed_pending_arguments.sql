-- A pending invocation's original arguments are sealed with the master key ring
-- (`arguments_sealed`); `arguments` keeps clear JSON only for rows written before this
-- migration, or by an engine used without a sealer. A POLICY_DENIED row keeps none: approval
-- can never run it, and approvers see the call's redacted input instead.
ALTER TABLE pending_invocations ADD COLUMN arguments_sealed TEXT COLLATE "C";
-- The master key that sealed them, so retiring a key sees what still needs it.
ALTER TABLE pending_invocations ADD COLUMN arguments_key_id TEXT COLLATE "C";
UPDATE pending_invocations SET arguments = NULL WHERE origin = 'POLICY_DENIED';
