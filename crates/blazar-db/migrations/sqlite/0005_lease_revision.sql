-- A lease's revision moves in every transaction that changes the lease, its reservations or
-- its events (the store's writes bump it at commit), so a rendered lease can be kept and
-- reused for as long as its revision stands, by any replica.
ALTER TABLE leases ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
