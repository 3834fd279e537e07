-- The deliveries of endpoints that gave no answer in time and are waiting or being tried
-- again: the deliverer looks for one per webhook before it claims the webhook's others.
CREATE INDEX webhook_deliveries_silent ON webhook_deliveries (webhook_id)
    WHERE status = 'pending' AND last_result = 'no answer in time';
