-- How many times an inventory kind changed in a way that can make a booking's choice stale
-- (capacity, properties, reservable, deletes), apart from `version`, which also counts new
-- resources: a booking checks this one, so registering hosts does not send it round again.
ALTER TABLE inventory_versions ADD COLUMN changes BIGINT NOT NULL DEFAULT 0;
UPDATE inventory_versions SET changes = version;
