-- A call's finish as a HOT update: PostgreSQL rewrites a row in place on its page (no new
-- entry in any index of the table) only when the update changes no indexed column, and a
-- column in a partial index's predicate counts. The finish changed `status` (the predicate of
-- `tool_calls_running`) and the sealed answer (`tool_calls_answer_expiry`), so every finish
-- added an entry to each of the table's four indexes, and every purge of an answer did again.
-- The calls in flight and the sealed answers now have small tables of their own, and the
-- finish changes only columns no index reads. (SQLite has no HOT: its finish already touches
-- only the indexes whose columns change, so its schema keeps both in `tool_calls`.)

-- The calls `running` now, with the gateway process that runs each (its instance key): a row
-- goes in with the call's `running` row, in the same statement, and out with its finish.
-- Tiny (only what is in flight); a crash leaves the rows of the dead owner's calls behind,
-- and recovery finds them here.
CREATE TABLE calls_in_flight (
    owner   BIGINT           NOT NULL,
    call_id TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (owner, call_id)
);

INSERT INTO calls_in_flight (owner, call_id)
    SELECT owner, id FROM tool_calls WHERE status = 'running';
DROP INDEX tool_calls_running;

-- A call's full answer, sealed with the key ring (AES-256-GCM, associated data binding tenant
-- and call id), written with the call's finish and deleted by the purge at `expires_at` (the
-- configured retention); the redacted copy in `tool_calls` stays.
CREATE TABLE call_answers (
    call_id    TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    tenant     TEXT COLLATE "C" NOT NULL,
    sealed     TEXT COLLATE "C" NOT NULL,
    expires_at BIGINT           NOT NULL
);

-- The answers in expiry order, for the purge.
CREATE INDEX call_answers_expiry ON call_answers (expires_at);

INSERT INTO call_answers (call_id, tenant, sealed, expires_at)
    SELECT id, tenant, answer_sealed, answer_expires_at FROM tool_calls
    WHERE answer_sealed IS NOT NULL AND answer_expires_at IS NOT NULL;
DROP INDEX tool_calls_answer_expiry;
ALTER TABLE tool_calls DROP COLUMN answer_sealed, DROP COLUMN answer_expires_at;

-- Room on each page for the finishes of the calls inserted there: an update is HOT only when
-- the row's new version fits on the same page. The group commit finishes many calls of one
-- page in one statement, before any of their old versions can be pruned, so each needs room
-- of its own: with a quarter of the page free 56% of the benchmark's finishes were HOT, with
-- half 95%. Applies to pages written from now on.
ALTER TABLE tool_calls SET (fillfactor = 50);
