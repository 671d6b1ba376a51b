-- +goose Up
-- The browser's conversation list (GET /api/conversations): a title the
-- user may set (empty: the first message stands in), the reference an
-- activity entry is about (a permission request's id, a build's id), so the
-- list can tell which requests are still pending (budget_ledger is already
-- indexed by conversation for its spend).
ALTER TABLE conversations ADD COLUMN title TEXT NOT NULL DEFAULT '';
ALTER TABLE activity_log ADD COLUMN ref TEXT NOT NULL DEFAULT '';
CREATE INDEX activity_log_type ON activity_log (conversation_id, type, event_id);
CREATE INDEX conversations_list ON conversations (user_id, tenant, env, created_at, id) WHERE deleted_at IS NULL;

-- +goose Down
DROP INDEX conversations_list;
DROP INDEX activity_log_type;
ALTER TABLE activity_log DROP COLUMN ref;
ALTER TABLE conversations DROP COLUMN title;
