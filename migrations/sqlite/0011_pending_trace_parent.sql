-- The W3C traceparent of the span a call was suspended in: the span of the decision on it
-- links to the call. NULL when traces are off, and for rows written before.
ALTER TABLE pending_invocations ADD COLUMN trace_parent TEXT;
