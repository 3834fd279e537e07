-- Standalone API tokens (auth mode "tokens"). Only a SHA-256 digest of each token's secret
-- is kept; the token itself is shown once, when it is created.

CREATE TABLE api_tokens (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    user_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    roles TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT
);
