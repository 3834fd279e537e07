-- A notification's place in the event stream (`seq`) is given after its transaction
-- commits, by one sequencer at a time (see `Tx::sequence_notifications`), so that the order
-- is the order rows became visible: numbering at insert (MAX + 1) gave two concurrent
-- transactions the same number, and a transaction that committed late a number behind a
-- reader's cursor. `written` is the order of the inserts, from a sequence: a lease's rows are
-- written under its lock, so it is that lease's order, which publishing and webhooks follow.
CREATE SEQUENCE notifications_written;
ALTER TABLE notifications ADD COLUMN written BIGINT;
UPDATE notifications SET written = seq;
SELECT setval('notifications_written', (SELECT COALESCE(MAX(seq), 0) + 1 FROM notifications), false);
ALTER TABLE notifications ALTER COLUMN written SET DEFAULT nextval('notifications_written');
ALTER TABLE notifications ALTER COLUMN written SET NOT NULL;
ALTER SEQUENCE notifications_written OWNED BY notifications.written;
ALTER TABLE notifications ALTER COLUMN seq DROP NOT NULL;
CREATE INDEX notifications_unsequenced ON notifications (written) WHERE seq IS NULL;
