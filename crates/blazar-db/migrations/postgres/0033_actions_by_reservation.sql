-- The reconciler asks whether a reservation id was ever this database's before it removes
-- what the cloud holds under it; a deleted lease's reservation survives only in its actions.
CREATE INDEX actions_reservation ON actions (reservation_id);
