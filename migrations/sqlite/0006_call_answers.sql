-- A call's full answer (the unredacted result the agent got, with every field of the reply),
-- sealed with the key ring (AES-256-GCM, associated data binding tenant and call id), so a
-- replay of the same tool_use_id, or an agent collecting the outcome of an approved call,
-- gets the answer itself rather than the ledger's redacted copy. Kept until `answer_expires_at`
-- (the configured retention), then purged (both columns set to NULL); the redacted copy stays.
ALTER TABLE tool_calls ADD COLUMN answer_sealed TEXT;
ALTER TABLE tool_calls ADD COLUMN answer_expires_at INTEGER;
-- Only the answers still kept, in expiry order, for the purge.
CREATE INDEX tool_calls_answer_expiry ON tool_calls (answer_expires_at)
    WHERE answer_sealed IS NOT NULL;

-- How many times the pipeline evaluated this call: 1, plus one for every repeat of its
-- tool_use_id that re-evaluated a refusal (only an execution that started is final). A
-- re-evaluation is a conditional update naming the evaluation it observed, so two concurrent
-- repeats never both proceed.
ALTER TABLE tool_calls ADD COLUMN evaluation INTEGER NOT NULL DEFAULT 1 CHECK (evaluation >= 1);

-- A call's pending invocations, for the replay of a call waiting for approval and for
-- superseding a policy denial when the call is evaluated again.
CREATE INDEX pending_invocations_call ON pending_invocations (tool_call_id, tenant);
