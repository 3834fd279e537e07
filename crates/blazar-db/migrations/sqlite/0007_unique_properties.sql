-- Chameleon's `is_unique` resource properties: no two resources of a type may hold the same
-- value of such a property (a node name, a switch port).
ALTER TABLE resource_properties ADD COLUMN is_unique BIGINT NOT NULL DEFAULT 0;
