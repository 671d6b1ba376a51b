-- +goose Up
-- Portable SQL: the same migrations run on SQLite and PostgreSQL. Times are
-- Unix milliseconds (BIGINT); money is in nano-USD (BIGINT).
CREATE TABLE users (
    id          TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL
);

CREATE TABLE grants (
    user_id  TEXT NOT NULL REFERENCES users(id),
    tenant   TEXT NOT NULL,
    env      TEXT NOT NULL,
    PRIMARY KEY (user_id, tenant, env)
);

CREATE TABLE conversations (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    env         TEXT NOT NULL,
    user_id     TEXT NOT NULL REFERENCES users(id),
    created_at  BIGINT NOT NULL
);
CREATE INDEX conversations_user ON conversations (user_id, created_at);

CREATE TABLE identity_tokens (
    jti         TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    env         TEXT NOT NULL,
    issued_at   BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX identity_tokens_tenant_env ON identity_tokens (tenant, env);

CREATE TABLE budget_limits (
    user_id     TEXT PRIMARY KEY,
    limit_nano  BIGINT NOT NULL
);

CREATE TABLE budget_usage (
    user_id        TEXT NOT NULL,
    period         TEXT NOT NULL,
    spent_nano     BIGINT NOT NULL DEFAULT 0,
    reserved_nano  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, period)
);

CREATE TABLE budget_reservations (
    id           TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL,
    period       TEXT NOT NULL,
    amount_nano  BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    settled_at   BIGINT
);
CREATE INDEX budget_reservations_open ON budget_reservations (expires_at) WHERE settled_at IS NULL;

CREATE TABLE budget_ledger (
    id               TEXT PRIMARY KEY,
    created_at       BIGINT NOT NULL,
    kind             TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    period           TEXT NOT NULL,
    reservation_id   TEXT NOT NULL,
    conversation_id  TEXT NOT NULL DEFAULT '',
    model            TEXT NOT NULL DEFAULT '',
    request_id       TEXT NOT NULL DEFAULT '',
    input_tokens     BIGINT NOT NULL DEFAULT 0,
    output_tokens    BIGINT NOT NULL DEFAULT 0,
    cache_write_5m   BIGINT NOT NULL DEFAULT 0,
    cache_write_1h   BIGINT NOT NULL DEFAULT 0,
    cache_read       BIGINT NOT NULL DEFAULT 0,
    amount_nano      BIGINT NOT NULL
);
CREATE INDEX budget_ledger_user ON budget_ledger (user_id, created_at);

-- +goose Down
DROP TABLE budget_ledger;
DROP TABLE budget_reservations;
DROP TABLE budget_usage;
DROP TABLE budget_limits;
DROP TABLE identity_tokens;
DROP TABLE conversations;
DROP TABLE grants;
DROP TABLE users;
