-- Which revision of the template set (its content hash) rendered the email that was sent, so an
-- operator can tell which wording a recipient got after a live template edit.
ALTER TABLE sent_notifications ADD COLUMN template_revision VARCHAR(64);
