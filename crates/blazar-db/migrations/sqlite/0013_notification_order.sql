-- `written`: the order in which notifications were inserted, which publishing and webhooks
-- follow per lease. SQLite has one writer, so a notification's place in the event stream
-- (`seq`, MAX + 1 at insert) is final at commit and the same as `written`; PostgreSQL
-- numbers `seq` after commit instead (its migration 0013 says why).
ALTER TABLE notifications ADD COLUMN written BIGINT;
UPDATE notifications SET written = seq;
