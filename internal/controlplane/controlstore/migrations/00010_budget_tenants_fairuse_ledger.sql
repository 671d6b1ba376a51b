-- +goose Up
-- Budgets, second step (issue 3): tenant default limits, what fair use
-- needs on reservations, and the ledger columns an operator queries by.
-- Portable SQL, as 00001.
CREATE TABLE budget_tenant_limits (
    tenant      TEXT PRIMARY KEY,
    limit_nano  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL DEFAULT 0
);

ALTER TABLE budget_limits ADD COLUMN updated_at BIGINT NOT NULL DEFAULT 0;

-- tokens_estimate counts towards fair use while the call is open; tokens
-- (all kinds, once settled) replaces it.
ALTER TABLE budget_reservations ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
ALTER TABLE budget_reservations ADD COLUMN tokens_estimate BIGINT NOT NULL DEFAULT 0;
ALTER TABLE budget_reservations ADD COLUMN tokens BIGINT;
CREATE INDEX budget_reservations_user_time ON budget_reservations (user_id, created_at);

-- outcome says how a debit was measured: complete, stream_error,
-- upstream_cut, client_disconnect, http_error, unmetered, ...
ALTER TABLE budget_ledger ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
ALTER TABLE budget_ledger ADD COLUMN env TEXT NOT NULL DEFAULT '';
ALTER TABLE budget_ledger ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
CREATE INDEX budget_ledger_conversation ON budget_ledger (conversation_id, created_at);
CREATE INDEX budget_ledger_time ON budget_ledger (created_at);

-- +goose Down
DROP INDEX budget_ledger_time;
DROP INDEX budget_ledger_conversation;
ALTER TABLE budget_ledger DROP COLUMN outcome;
ALTER TABLE budget_ledger DROP COLUMN env;
ALTER TABLE budget_ledger DROP COLUMN tenant;
DROP INDEX budget_reservations_user_time;
ALTER TABLE budget_reservations DROP COLUMN tokens;
ALTER TABLE budget_reservations DROP COLUMN tokens_estimate;
ALTER TABLE budget_reservations DROP COLUMN tenant;
ALTER TABLE budget_limits DROP COLUMN updated_at;
DROP TABLE budget_tenant_limits;
