-- Availability probes and the overlap check look up a resource's allocations by start and
-- then test where they end and whether they are exclusive. With those columns in the index
-- they never visit the table rows.
CREATE INDEX allocations_resource_span
    ON allocations (resource_type, resource_id, start_at, blocked_until, exclusive);
DROP INDEX allocations_resource;
