-- The allocation list reads, for a range of resources, which reservation holds each of
-- them. With the reservation in the resource index the list reads the index alone (an
-- index-only scan, once vacuum has marked the table's pages all-visible: see
-- `Store::refresh_statistics`) instead of one table row per allocation, which was most of
-- its time. The lease is read through the reservation, once per reservation, so only the
-- reservation is carried. PostgreSQL only: SQLite has no visibility map to consult, and its
-- list reads a table row per allocation well within its time.
CREATE INDEX allocations_resource_span_holder
    ON allocations (resource_type, resource_id, start_at, blocked_until, exclusive)
    INCLUDE (reservation_id);
DROP INDEX allocations_resource_span;
ALTER INDEX allocations_resource_span_holder RENAME TO allocations_resource_span;
