-- The keyed audit chain. New events carry `key_id`, the master key whose derived chain key
-- MAC'd them (HMAC-SHA-256; `hash` holds the MAC), and `binding`, the recorded content of the
-- call rows they report (status, error code, digests of the redacted input and output, the
-- policy decision, the pending invocation), covered by the MAC. Events written before this
-- migration keep NULL in both: their `hash` is the unkeyed SHA-256 of the earlier format, and
-- verification reports them as legacy. Existing rows are unchanged; the append-only triggers
-- still refuse every UPDATE and DELETE.
ALTER TABLE audit_events ADD COLUMN key_id TEXT COLLATE "C", ADD COLUMN binding TEXT COLLATE "C";
