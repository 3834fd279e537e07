-- An action failing transiently is retried for a span of time counted from its first
-- attempt (not for a number of attempts), so its retries can stay a short pause apart and
-- it finishes soon after the service it needs is back. Attempts that did not report back
-- (their worker stopped or hung) are counted apart: an action that takes its worker down
-- must fail after a few, whatever the span left.
ALTER TABLE actions ADD COLUMN first_tried_at BIGINT;
ALTER TABLE actions ADD COLUMN lost_attempts BIGINT NOT NULL DEFAULT 0;
