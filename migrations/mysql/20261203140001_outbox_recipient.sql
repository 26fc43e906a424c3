-- Jobs not yet claimed are found by recipient too: the outbox's first `to` address, normalised as
-- the ledger's `recipient` is (the address inside `Name <…>`, the domain in lower case, the local
-- part as given). Virtual columns computed from the payload, so rows written in plain SQL by any
-- producer have them; only the index is stored. An address longer than the ledger's 1000 bytes is
-- not kept (NULL, never an error: a too-long value would fail the producer's INSERT).
ALTER TABLE mailroom_outbox
    ADD COLUMN to_address TEXT AS (TRIM(IF(
        LOCATE('<', JSON_UNQUOTE(JSON_EXTRACT(payload, '$.to[0]'))) > 0,
        SUBSTRING_INDEX(SUBSTRING_INDEX(JSON_UNQUOTE(JSON_EXTRACT(payload, '$.to[0]')), '<', -1), '>', 1),
        JSON_UNQUOTE(JSON_EXTRACT(payload, '$.to[0]'))))) VIRTUAL,
    ADD COLUMN recipient VARBINARY(1000) AS (IF(
        LOCATE('@', to_address) > 0
        AND LENGTH(CONCAT(LEFT(to_address, CHAR_LENGTH(to_address) - CHAR_LENGTH(SUBSTRING_INDEX(to_address, '@', -1))),
                          LOWER(SUBSTRING_INDEX(to_address, '@', -1)))) <= 1000,
        CAST(CONCAT(LEFT(to_address, CHAR_LENGTH(to_address) - CHAR_LENGTH(SUBSTRING_INDEX(to_address, '@', -1))),
                    LOWER(SUBSTRING_INDEX(to_address, '@', -1))) AS BINARY),
        NULL)) VIRTUAL,
    ADD KEY mailroom_outbox_recipient (recipient, created_at);
