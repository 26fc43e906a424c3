-- The console's revision history of templates, per kind and locale ('' is the default files):
-- every save writes one row with the three parts as saved, so any `serve` process shows the
-- same history and a diff needs nothing from the template directory. `hash` is the SHA-256 of
-- the parts (src/console/files.rs); `author` the name given at login.
CREATE TABLE mailroom_template_revisions (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    kind       VARCHAR(128) NOT NULL,
    locale     VARCHAR(35)  NOT NULL,
    hash       CHAR(64)     NOT NULL,
    subject    MEDIUMTEXT   NOT NULL,
    html       MEDIUMTEXT   NOT NULL,
    text       MEDIUMTEXT,
    author     VARCHAR(128) NOT NULL,
    created_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY mailroom_template_revisions_by_template (kind, locale, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
