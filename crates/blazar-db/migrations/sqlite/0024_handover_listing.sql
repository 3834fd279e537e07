-- Hand-over lists are read a page at a time in their order (type, resource, start, id), so
-- years of history are never read at once; and by lease.
CREATE INDEX handovers_listing ON handovers (resource_type, resource_id, started_at, id);
CREATE INDEX handovers_lease ON handovers (lease_id);
