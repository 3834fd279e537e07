-- Every resource type: instance capacity shares hosts, floating IPs, network segments and
-- devices live in one inventory table, flavors for flavor:instance, healing bookkeeping, and
-- an outbox of notifications.

-- Instance reservations hold host capacity without excluding each other: a shared allocation
-- carries the size it uses, and only conflicts with exclusive allocations of the resource.
ALTER TABLE allocations ADD COLUMN exclusive BIGINT NOT NULL DEFAULT 1;
ALTER TABLE allocations ADD COLUMN share_key BIGINT NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN units BIGINT NOT NULL DEFAULT 1;
ALTER TABLE allocations ADD COLUMN vcpus BIGINT NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN memory_mb BIGINT NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN disk_gb BIGINT NOT NULL DEFAULT 0;

DROP TRIGGER allocations_no_overlap_insert;
DROP TRIGGER allocations_no_overlap_update;

CREATE TRIGGER allocations_no_overlap_insert
BEFORE INSERT ON allocations
WHEN EXISTS (
    SELECT 1 FROM allocations a
    WHERE a.resource_type = NEW.resource_type
      AND a.resource_id = NEW.resource_id
      AND a.start_at < NEW.blocked_until
      AND NEW.start_at < a.blocked_until
      AND (a.exclusive = 1 OR NEW.exclusive = 1)
)
BEGIN
    SELECT RAISE(ABORT, 'allocation_overlap');
END;

CREATE TRIGGER allocations_no_overlap_update
BEFORE UPDATE OF resource_type, resource_id, start_at, blocked_until, exclusive ON allocations
WHEN EXISTS (
    SELECT 1 FROM allocations a
    WHERE a.id <> NEW.id
      AND a.resource_type = NEW.resource_type
      AND a.resource_id = NEW.resource_id
      AND a.start_at < NEW.blocked_until
      AND NEW.start_at < a.blocked_until
      AND (a.exclusive = 1 OR NEW.exclusive = 1)
)
BEGIN
    SELECT RAISE(ABORT, 'allocation_overlap');
END;

-- How many units (hosts, slots, addresses, ...) a reservation was granted: healing restores
-- that many.
ALTER TABLE reservations ADD COLUMN granted_units BIGINT NOT NULL DEFAULT 0;

-- Floating IPs, network segments and devices. `uid` is the API id; `uniq` is what must be
-- unique per kind (an address on a network, a segment on a physical network, a device name).
CREATE TABLE resources (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    uniq TEXT NOT NULL,
    attrs TEXT NOT NULL,
    reservable BIGINT NOT NULL DEFAULT 1,
    created_at BIGINT NOT NULL,
    updated_at BIGINT,
    UNIQUE (kind, uniq)
);

CREATE TABLE resource_capabilities (
    resource_id BIGINT NOT NULL REFERENCES resources (id) ON DELETE CASCADE,
    property_id TEXT NOT NULL REFERENCES resource_properties (id),
    value TEXT NOT NULL,
    PRIMARY KEY (resource_id, property_id)
);

CREATE TABLE flavors (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    vcpus BIGINT NOT NULL,
    ram BIGINT NOT NULL,
    disk BIGINT NOT NULL,
    ephemeral BIGINT NOT NULL,
    extra_specs TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT
);

-- Notifications waiting for the notification layer (lease healed, degraded, ...).
CREATE TABLE notifications (
    id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    event_type TEXT NOT NULL,
    lease_id TEXT,
    payload TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX notifications_seq ON notifications (seq);

-- A counter per inventory kind, moved by every change to that inventory, so a process can
-- keep the inventory in memory and know in one read whether its copy is current.
CREATE TABLE inventory_versions (
    kind TEXT PRIMARY KEY,
    version BIGINT NOT NULL
);

-- The longest allocation of each resource type, so that a window query can bound its index
-- scan on start times: past, ended allocations never slow down present work.
CREATE TABLE allocation_spans (
    resource_type TEXT PRIMARY KEY,
    max_span BIGINT NOT NULL
);
CREATE INDEX allocations_start ON allocations (resource_type, start_at);
