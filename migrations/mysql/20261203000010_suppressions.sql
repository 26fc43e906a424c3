-- Addresses mailroom does not send to: hard bounces, complaints, unsubscribes, and entries an
-- operator made. `address` is normalised as the recipient search compares it: the domain in
-- lower case, the local part exactly as given (it may be case-sensitive). VARBINARY: compared
-- byte for byte, so no PAD SPACE collation makes 'ada@example.com ' the same key as
-- 'ada@example.com', and no case folding merges two mailboxes.
CREATE TABLE mailroom_suppressions (
    address    VARBINARY(1000) NOT NULL PRIMARY KEY,
    reason     VARCHAR(16)     NOT NULL,
    detail     TEXT            NULL,
    created_by VARCHAR(255)    NOT NULL,
    created_at DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    CONSTRAINT mailroom_suppressions_reason
        CHECK (reason IN ('hard_bounce', 'complaint', 'unsubscribed', 'manual')),
    KEY mailroom_suppressions_created (created_at, address)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
