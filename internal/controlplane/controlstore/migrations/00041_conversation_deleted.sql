-- +goose Up
-- A deleted conversation keeps its row (the ledger and the reports name
-- it) with the time of deletion; live ones are counted for the quotas.
ALTER TABLE conversations ADD COLUMN deleted_at BIGINT;
CREATE INDEX conversations_live ON conversations (tenant, env, user_id) WHERE deleted_at IS NULL;

-- +goose Down
DROP INDEX conversations_live;
ALTER TABLE conversations DROP COLUMN deleted_at;
