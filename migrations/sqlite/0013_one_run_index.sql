-- One index of a run's calls instead of two. Both were led by the run, so with many runs in
-- flight each took a page of its own on every call: a call's entry lands beside its run's
-- earlier calls, a different page for every run. The idempotency key's index now holds every
-- call (a NULL `tool_use_id` is distinct from every other, so uniqueness is unchanged) and
-- serves listing a run's calls as well: their `seq` is in each entry (the rowid), so a page
-- of the list is read from the index alone and sorted, then only its rows are fetched.
DROP INDEX tool_calls_run_tool_use_id;
CREATE UNIQUE INDEX tool_calls_run_tool_use_id ON tool_calls (run, tenant, tool_use_id);
DROP INDEX tool_calls_run;
