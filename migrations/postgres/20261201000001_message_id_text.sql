-- A Message-ID writes every byte of the job id outside [A-Za-z0-9_-] as `=XX`: a job id of 200
-- bytes (the limit, whatever its characters) makes a Message-ID of up to about 900 characters,
-- more than the 512 this column held, and every claim of such a job failed. `job_id` (200
-- characters) already holds any 200-byte id, and PostgreSQL compares it byte for byte.
ALTER TABLE sent_notifications ALTER COLUMN message_id TYPE TEXT;
