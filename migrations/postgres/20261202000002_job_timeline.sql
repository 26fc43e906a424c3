-- What the Jobs page needs from the ledger: who a job was for, when its current attempt was
-- claimed, and what each earlier attempt did.
-- `recipient`: the first `to` address, normalised (domain in lower case, local part as given),
-- written by the claim itself, so a delivery pays no extra statement for it.
-- `claimed_at`: when the current attempt was claimed.
-- `history`: the failed attempts (failed, uncertain, dead) and replays, newest 20 kept, each
-- appended by the UPDATE that records the failure (a sent attempt appends nothing: the row
-- itself says it).
ALTER TABLE sent_notifications
    ADD COLUMN recipient  TEXT,
    ADD COLUMN claimed_at TIMESTAMPTZ,
    ADD COLUMN history    JSONB;
CREATE INDEX sent_notifications_recipient ON sent_notifications (recipient, created_at);
CREATE INDEX sent_notifications_created_at ON sent_notifications (created_at);
CREATE INDEX mailroom_outbox_created_at ON mailroom_outbox (created_at);
