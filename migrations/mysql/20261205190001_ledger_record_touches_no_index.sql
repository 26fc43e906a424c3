-- Recording a send must write no index entry: a record updates `status`, `updated_at`, the
-- reply and the history of the row its claim inserted, and with an index on `updated_at` every
-- record also moved the row's entry in that index. No other index holds a column a record
-- changes. The retention (src/db/ledger_retention.rs) now finds old rows through `created_at`
-- and walks the primary key.
ALTER TABLE sent_notifications DROP INDEX sent_notifications_updated_at;
