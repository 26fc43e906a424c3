-- Recording a send must cost the database one row version and no index entry.
--
-- A record updates `status`, `updated_at`, the reply and the history of the row its claim
-- inserted. With an index on `updated_at`, every record was a non-HOT update: a new row version
-- plus a new entry in every index of the table (four). Without it, no indexed column changes
-- (the key, `recipient` and `created_at` are written once, by the claim), so the record can be a
-- HOT update (heap-only tuple) when the row's page has room for the new version: the table keeps
-- that room with a fill factor of 70 (new pages only; rows written before keep their pages).
--
-- The retention (src/db/ledger_retention.rs) now finds old rows through `created_at`, which a
-- row never changes: a row is deleted when it was created and last updated before the horizon.
DROP INDEX IF EXISTS sent_notifications_updated_at;
ALTER TABLE sent_notifications SET (fillfactor = 70);
