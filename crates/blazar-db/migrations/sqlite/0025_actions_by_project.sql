-- A project's actions, newest first (GET /v1/actions of a member), without reading every
-- project's.
CREATE INDEX actions_project ON actions (project_id, seq);
