-- Calendar feeds: a project's leases as an iCalendar (.ics) document at a URL that carries
-- its own secret, for calendar applications that cannot send a token. Only the SHA-256
-- digest of the secret is kept; deleting the row revokes the URL.
CREATE TABLE ical_feeds (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    project_id TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_by TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX ical_feeds_project ON ical_feeds (project_id);
