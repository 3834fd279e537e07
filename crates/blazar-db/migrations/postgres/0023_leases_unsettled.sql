-- The leases that have not ended, by status: /metrics counts leases per status at every
-- scrape, and ended leases pile up over the years. Partial, so that it stays as small as the
-- present and no query naming a status through a parameter is planned onto it.
CREATE INDEX leases_unsettled ON leases (status) WHERE status <> 'TERMINATED';
