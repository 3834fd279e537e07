-- A resource taken back from a reservation and handed to it again has two periods on
-- record: one open hand-over per (reservation, resource) at a time, any number ended.
CREATE TABLE handovers_periods (
    id TEXT PRIMARY KEY,
    resource_type TEXT NOT NULL,
    resource_id BIGINT NOT NULL,
    project_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    reservation_id TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    ended_at BIGINT
);
INSERT INTO handovers_periods
    SELECT id, resource_type, resource_id, project_id, lease_id, reservation_id, started_at,
           ended_at
    FROM handovers;
DROP TABLE handovers;
ALTER TABLE handovers_periods RENAME TO handovers;
CREATE INDEX handovers_current ON handovers (resource_type, ended_at);
CREATE UNIQUE INDEX handovers_open ON handovers (reservation_id, resource_type, resource_id)
    WHERE ended_at IS NULL;
