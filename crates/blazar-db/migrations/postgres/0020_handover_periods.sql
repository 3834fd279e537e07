-- A resource taken back from a reservation and handed to it again has two periods on
-- record: one open hand-over per (reservation, resource) at a time, any number ended.
ALTER TABLE handovers
    DROP CONSTRAINT IF EXISTS handovers_reservation_id_resource_type_resource_id_key;
CREATE UNIQUE INDEX handovers_open ON handovers (reservation_id, resource_type, resource_id)
    WHERE ended_at IS NULL;
