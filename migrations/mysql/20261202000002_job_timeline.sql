-- What the Jobs page needs from the ledger: who a job was for, when its current attempt was
-- claimed, and what each earlier attempt did.
-- `recipient`: the first `to` address, normalised (domain in lower case, local part as given),
-- written by the claim itself, so a delivery pays no extra statement for it. VARBINARY: it is
-- compared byte for byte (no PAD SPACE, no case folding of the local part); 1000 bytes hold any
-- address a job admits (one header line).
-- `claimed_at`: when the current attempt was claimed.
-- `history`: a JSON array of the failed attempts (failed, uncertain, dead) and replays, newest
-- 20 kept, each appended by the UPDATE that records the failure.
ALTER TABLE sent_notifications
    ADD COLUMN recipient  VARBINARY(1000) NULL,
    ADD COLUMN claimed_at DATETIME(6) NULL,
    ADD COLUMN history    LONGTEXT NULL,
    ADD KEY sent_notifications_recipient (recipient, created_at),
    ADD KEY sent_notifications_created_at (created_at);
ALTER TABLE mailroom_outbox
    ADD KEY mailroom_outbox_created_at (created_at);
