-- Keys compare byte for byte. utf8mb4_bin is a PAD SPACE collation: `same` and `same ` were one
-- key, so the second of two such jobs was taken for the first, already claimed, and never sent.
-- VARBINARY has no pad and no collation, on MySQL 8 and MariaDB alike. Its 800 bytes hold every
-- id the former VARCHAR(200) of utf8mb4 could (mailroom now admits ids of at most 200 bytes).
ALTER TABLE sent_notifications
    MODIFY job_id VARBINARY(800) NOT NULL,
    -- A Message-ID writes every byte of the job id outside [A-Za-z0-9_-] as `=XX`: up to about
    -- 900 characters for a 200-byte id, more than the 512 this column held.
    MODIFY message_id TEXT NOT NULL;
ALTER TABLE mailroom_outbox
    MODIFY job_id VARBINARY(800) NOT NULL;
