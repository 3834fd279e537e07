-- When deliveries of a webhook were last claimed (seconds): a claim asks the webhooks
-- served least lately first, so one endpoint's old backlog does not keep the others waiting.
ALTER TABLE webhooks ADD COLUMN last_claimed_at BIGINT;
