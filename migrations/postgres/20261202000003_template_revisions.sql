-- The console's revision history of templates, per kind and locale ('' is the default files):
-- every save writes one row with the three parts as saved, so any `serve` process shows the
-- same history and a diff needs nothing from the template directory. `hash` is the SHA-256 of
-- the parts (src/console/files.rs); `author` the name given at login.
CREATE TABLE mailroom_template_revisions (
    id         BIGSERIAL   PRIMARY KEY,
    kind       TEXT        NOT NULL,
    locale     TEXT        NOT NULL,
    hash       TEXT        NOT NULL,
    subject    TEXT        NOT NULL,
    html       TEXT        NOT NULL,
    text       TEXT,
    author     TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX mailroom_template_revisions_by_template
    ON mailroom_template_revisions (kind, locale, id);
