-- +goose Up
-- Worker reports (issue 4): tool calls, turn usage, the activity log and the
-- issues of each tenant-env. Portable SQL for SQLite and PostgreSQL; times
-- are Unix milliseconds.

-- One row per stored report write: a retried report finds its receipt and
-- gets the first answer back instead of being applied twice. The key is
-- scoped to the conversation of the WorkerToken that sent it.
CREATE TABLE report_receipts (
    tenant           TEXT NOT NULL,
    env              TEXT NOT NULL,
    conversation_id  TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    kind             TEXT NOT NULL,
    body_sha256      TEXT NOT NULL,
    response         TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (tenant, env, conversation_id, idempotency_key)
);

CREATE TABLE activity_log (
    conversation_id  TEXT NOT NULL,
    event_id         BIGINT NOT NULL,
    tenant           TEXT NOT NULL,
    env              TEXT NOT NULL,
    type             TEXT NOT NULL,
    summary          TEXT NOT NULL,
    at               BIGINT NOT NULL,
    received_at      BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, event_id)
);

-- A tool call is one row, written by its "use" and its "result" report in
-- either order.
CREATE TABLE tool_calls (
    conversation_id   TEXT NOT NULL,
    tool_use_id       TEXT NOT NULL,
    tenant            TEXT NOT NULL,
    env               TEXT NOT NULL,
    name              TEXT NOT NULL DEFAULT '',
    input             TEXT NOT NULL DEFAULT '',
    output            TEXT NOT NULL DEFAULT '',
    is_error          INTEGER NOT NULL DEFAULT 0,
    has_result        INTEGER NOT NULL DEFAULT 0,
    first_event_id    BIGINT NOT NULL,
    started_at        BIGINT,
    finished_at       BIGINT,
    PRIMARY KEY (conversation_id, tool_use_id)
);

CREATE TABLE turn_usage (
    conversation_id     TEXT NOT NULL,
    event_id            BIGINT NOT NULL,
    tenant              TEXT NOT NULL,
    env                 TEXT NOT NULL,
    user_id             TEXT NOT NULL,
    client_message_id   TEXT NOT NULL,
    outcome             TEXT NOT NULL,
    input_tokens        BIGINT NOT NULL,
    output_tokens       BIGINT NOT NULL,
    cache_write_tokens  BIGINT NOT NULL,
    cache_read_tokens   BIGINT NOT NULL,
    cost_nano           BIGINT NOT NULL,
    num_turns           BIGINT NOT NULL,
    duration_ms         BIGINT NOT NULL,
    at                  BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, event_id)
);

CREATE TABLE issue_counters (
    tenant       TEXT NOT NULL,
    env          TEXT NOT NULL,
    last_number  BIGINT NOT NULL,
    PRIMARY KEY (tenant, env)
);

CREATE TABLE issues (
    tenant           TEXT NOT NULL,
    env              TEXT NOT NULL,
    number           BIGINT NOT NULL,
    title            TEXT NOT NULL,
    body             TEXT NOT NULL,
    state            TEXT NOT NULL,
    conversation_id  TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    last_comment     BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, env, number)
);
CREATE INDEX issues_state ON issues (tenant, env, state, number);

CREATE TABLE issue_comments (
    tenant           TEXT NOT NULL,
    env              TEXT NOT NULL,
    number           BIGINT NOT NULL,
    seq              BIGINT NOT NULL,
    body             TEXT NOT NULL,
    conversation_id  TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (tenant, env, number, seq)
);

-- +goose Down
DROP TABLE issue_comments;
DROP TABLE issues;
DROP TABLE issue_counters;
DROP TABLE turn_usage;
DROP TABLE tool_calls;
DROP TABLE activity_log;
DROP TABLE report_receipts;
