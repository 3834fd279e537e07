-- Initial schema. Times are UTC seconds since the Unix epoch; booleans are 0/1 so that
-- the same queries read both backends.

CREATE TABLE hosts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hypervisor_hostname TEXT NOT NULL UNIQUE,
    service_name TEXT NOT NULL,
    hypervisor_type TEXT NOT NULL,
    hypervisor_version BIGINT NOT NULL,
    vcpus BIGINT NOT NULL,
    memory_mb BIGINT NOT NULL,
    local_gb BIGINT NOT NULL,
    cpu_info TEXT NOT NULL,
    availability_zone TEXT NOT NULL,
    status TEXT,
    reservable BIGINT NOT NULL DEFAULT 1,
    trust_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT
);

CREATE TABLE resource_properties (
    id TEXT PRIMARY KEY,
    resource_type TEXT NOT NULL,
    property_name TEXT NOT NULL,
    private BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT,
    UNIQUE (resource_type, property_name)
);

CREATE TABLE host_capabilities (
    host_id BIGINT NOT NULL REFERENCES hosts (id) ON DELETE CASCADE,
    property_id TEXT NOT NULL REFERENCES resource_properties (id),
    value TEXT NOT NULL,
    PRIMARY KEY (host_id, property_id)
);

CREATE TABLE leases (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    user_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    trust_id TEXT NOT NULL,
    start_at BIGINT NOT NULL,
    end_at BIGINT NOT NULL,
    status TEXT NOT NULL,
    degraded BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT
);
CREATE INDEX leases_project ON leases (project_id);

CREATE TABLE reservations (
    id TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL REFERENCES leases (id) ON DELETE CASCADE,
    ordinal BIGINT NOT NULL,
    resource_id TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    status TEXT NOT NULL,
    missing_resources BIGINT NOT NULL DEFAULT 0,
    resources_changed BIGINT NOT NULL DEFAULT 0,
    params TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT
);
CREATE INDEX reservations_lease ON reservations (lease_id);

CREATE TABLE events (
    id TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL REFERENCES leases (id) ON DELETE CASCADE,
    event_type TEXT NOT NULL,
    event_time BIGINT NOT NULL,
    rank BIGINT NOT NULL,
    status TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT,
    UNIQUE (lease_id, event_type)
);
CREATE INDEX events_due ON events (status, event_time, rank);

-- One row per resource granted to a reservation. [start_at, blocked_until) is the time the
-- resource is unavailable to anyone else: the lease window plus the cleaning margin.
CREATE TABLE allocations (
    id TEXT PRIMARY KEY,
    reservation_id TEXT NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    lease_id TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id BIGINT NOT NULL,
    start_at BIGINT NOT NULL,
    end_at BIGINT NOT NULL,
    blocked_until BIGINT NOT NULL,
    CHECK (start_at < end_at AND end_at <= blocked_until)
);
CREATE INDEX allocations_resource ON allocations (resource_type, resource_id, start_at);
CREATE INDEX allocations_window ON allocations (resource_type, blocked_until, start_at);
CREATE INDEX allocations_reservation ON allocations (reservation_id);
CREATE INDEX allocations_lease ON allocations (lease_id);

-- The database itself refuses two overlapping allocations of one resource, whatever the
-- application does. Writers also serialise on BEGIN IMMEDIATE.
CREATE TRIGGER allocations_no_overlap_insert
BEFORE INSERT ON allocations
WHEN EXISTS (
    SELECT 1 FROM allocations a
    WHERE a.resource_type = NEW.resource_type
      AND a.resource_id = NEW.resource_id
      AND a.start_at < NEW.blocked_until
      AND NEW.start_at < a.blocked_until
)
BEGIN
    SELECT RAISE(ABORT, 'allocation_overlap');
END;

CREATE TRIGGER allocations_no_overlap_update
BEFORE UPDATE OF resource_type, resource_id, start_at, blocked_until ON allocations
WHEN EXISTS (
    SELECT 1 FROM allocations a
    WHERE a.id <> NEW.id
      AND a.resource_type = NEW.resource_type
      AND a.resource_id = NEW.resource_id
      AND a.start_at < NEW.blocked_until
      AND NEW.start_at < a.blocked_until
)
BEGIN
    SELECT RAISE(ABORT, 'allocation_overlap');
END;

-- What the standalone backend did at lease start and end: which project holds which resource.
CREATE TABLE handovers (
    id TEXT PRIMARY KEY,
    resource_type TEXT NOT NULL,
    resource_id BIGINT NOT NULL,
    project_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    ended_at BIGINT,
    UNIQUE (reservation_id, resource_type, resource_id)
);
CREATE INDEX handovers_current ON handovers (resource_type, ended_at);
