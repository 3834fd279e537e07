-- Deliveries are claimed per webhook (webhook_deliveries_pending); nothing reads pending
-- deliveries by time across webhooks, so this index only cost a write on every delivery.
DROP INDEX IF EXISTS webhook_deliveries_due;
