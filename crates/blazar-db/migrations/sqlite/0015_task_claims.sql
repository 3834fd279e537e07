-- Work that runs on a timer in every scheduler replica but must run in one at a time (the
-- reconciler's repairs): the replica that holds a task's row until `held_until` runs it.
-- A replica that stops mid-task leaves the row; it is taken over once `held_until` passes.
CREATE TABLE task_claims (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    held_until BIGINT NOT NULL
);
