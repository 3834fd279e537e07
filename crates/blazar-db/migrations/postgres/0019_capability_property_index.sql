-- Every value of one property: what property listings, property queries and the check
-- that a property is in use read. Without it each property scanned every capability, so
-- listing a site with thousands of property names took seconds to minutes.
CREATE INDEX host_capabilities_property ON host_capabilities (property_id, value);
CREATE INDEX resource_capabilities_property ON resource_capabilities (property_id, value);
