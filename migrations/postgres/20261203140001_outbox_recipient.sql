-- Jobs not yet claimed are found by recipient too: the outbox's first `to` address, normalised as
-- the ledger's `recipient` is (the address inside `Name <…>`, the domain in lower case, the local
-- part as given). Generated from the payload, so rows written in plain SQL by any producer have
-- it, and existing rows get it now (PostgreSQL rewrites the table once; the outbox holds only
-- rows not yet deleted by retention).
ALTER TABLE mailroom_outbox
    ADD COLUMN recipient TEXT GENERATED ALWAYS AS (
        regexp_replace(
            COALESCE(substring(payload->'to'->>0 from '<([^<>]*)>\s*$'), btrim(payload->'to'->>0)),
            '@[^@]*$', '')
        || '@'
        || lower(substring(
            COALESCE(substring(payload->'to'->>0 from '<([^<>]*)>\s*$'), btrim(payload->'to'->>0))
            from '@([^@]*)$'))
    ) STORED;
CREATE INDEX mailroom_outbox_recipient ON mailroom_outbox (recipient, created_at);
