-- Whether a lease's trust_id names a Keystone trust made at its create (act_for_user =
-- trust), which the service acts through and deletes with the lease. Leases made before, or
-- in another mode, keep an id of the same shape that names nothing: 0.
ALTER TABLE leases ADD COLUMN keystone_trust BIGINT NOT NULL DEFAULT 0;
