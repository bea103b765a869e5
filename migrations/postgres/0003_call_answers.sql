-- A call's full answer, sealed with the key ring (AES-256-GCM, associated data binding tenant
-- and call id), kept until `answer_expires_at` (the configured retention), then purged (both
-- columns set to NULL); the redacted copy stays. See the SQLite migration of the same name.
ALTER TABLE tool_calls ADD COLUMN answer_sealed TEXT COLLATE "C";
ALTER TABLE tool_calls ADD COLUMN answer_expires_at BIGINT;
CREATE INDEX tool_calls_answer_expiry ON tool_calls (answer_expires_at)
    WHERE answer_sealed IS NOT NULL;

-- How many times the pipeline evaluated this call: 1, plus one for every repeat of its
-- tool_use_id that re-evaluated a refusal. Re-evaluations are conditional on the value seen.
ALTER TABLE tool_calls ADD COLUMN evaluation BIGINT NOT NULL DEFAULT 1 CHECK (evaluation >= 1);

-- A call's pending invocations, for the replay of a call waiting for approval and for
-- superseding a policy denial when the call is evaluated again.
CREATE INDEX pending_invocations_call ON pending_invocations (tool_call_id, tenant);
