-- +goose Up
-- The model a conversation was created with, so a worker that lost (or
-- never got) the session can create it again with the same model.
ALTER TABLE conversations ADD COLUMN model TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE conversations DROP COLUMN model;
