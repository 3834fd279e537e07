-- The outbox listed in the order it was written, a page at a time (`GET /v1/notifications`
-- streams it): each page starts after the last one's `written` without reading the rows
-- before it (the id breaks ties).
CREATE INDEX notifications_by_written ON notifications (written, id);
