-- The class of the failure that made a row `dead` (invalid, template, rejected, exhausted), so
-- a redelivered copy of a dead job can be dead-lettered again with its original reason when the
-- first dead letter never reached the queue (a broker connection lost mid-publish).
ALTER TABLE sent_notifications ADD COLUMN error_class VARCHAR(16);
