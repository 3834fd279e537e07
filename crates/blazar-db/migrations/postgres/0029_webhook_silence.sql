-- Whether a webhook's endpoint gave no answer in time at its latest attempt: until it
-- answers again it is tried one delivery at a time, whatever became of the deliveries that
-- went unanswered (dead ones included).
ALTER TABLE webhooks ADD COLUMN silent INTEGER NOT NULL DEFAULT 0;
UPDATE webhooks SET silent = 1 WHERE id IN (
    SELECT webhook_id FROM webhook_deliveries
    WHERE status = 'pending' AND last_result = 'no answer in time');
-- The deliveries being sent: a silent webhook's others wait while one is.
CREATE INDEX webhook_deliveries_claimed ON webhook_deliveries (webhook_id)
    WHERE claimed_by IS NOT NULL;
