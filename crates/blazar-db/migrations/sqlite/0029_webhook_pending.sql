-- A webhook's pending deliveries, longest due first: the deliverer claims each webhook's
-- few due ones through it, and reads when a webhook's earliest is due, without walking the
-- due deliveries of endpoints that cannot take more (a silent or busy endpoint's backlog).
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook_id, next_attempt_at, seq)
    WHERE status = 'pending';
