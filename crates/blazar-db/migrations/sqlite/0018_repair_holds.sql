-- What a repairing reconciler pass is changing in the cloud: a lease (its actions) or a
-- resource (the actions on it). While the pass holds the `reconcile` task claim no action
-- on what it holds is claimed, so a repair and a hand-over of the same thing never run at
-- once; the rows of a pass whose claim ran out count for nothing.
CREATE TABLE repair_holds (
    holder TEXT NOT NULL,
    lease_id TEXT,
    resource_type TEXT,
    resource_id BIGINT
);
CREATE INDEX repair_holds_lease ON repair_holds (lease_id);
CREATE INDEX repair_holds_resource ON repair_holds (resource_type, resource_id);
