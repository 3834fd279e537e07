-- Notifications are published (to RabbitMQ) after the transaction that wrote them commits.
-- A publisher claims unsent rows for a while (claimed_by, claimed_until), publishes them in
-- order per lease and sets sent_at once the broker confirmed them; a claim that expired
-- (its publisher died) is taken over, so a row may go out twice but is never lost.
ALTER TABLE notifications ADD COLUMN sent_at BIGINT;
ALTER TABLE notifications ADD COLUMN claimed_by TEXT;
ALTER TABLE notifications ADD COLUMN claimed_until BIGINT;
-- Rows written before publishing existed are not announced after the fact.
UPDATE notifications SET sent_at = created_at;
CREATE INDEX notifications_unsent ON notifications (seq) WHERE sent_at IS NULL;
CREATE INDEX notifications_lease ON notifications (lease_id, seq);
