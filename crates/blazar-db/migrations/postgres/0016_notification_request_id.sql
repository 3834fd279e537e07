-- The global request id of the API call whose change a notification describes (none for
-- the scheduler's events): published as the message's `_context_request_id`, as Blazar's
-- notifications carry the id of the request that caused them.
ALTER TABLE notifications ADD COLUMN request_id TEXT;
