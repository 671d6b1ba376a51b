-- +goose Up
-- Facts about this installation, name → value. "installation_id" names the
-- database: the worker provisioner labels what it makes with it, so a
-- control plane with another database never adopts or removes it.
CREATE TABLE installation (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
);
-- The identity token the worker's Secret holds, once written.
ALTER TABLE workers ADD COLUMN identity_jti TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE workers DROP COLUMN identity_jti;
DROP TABLE installation;
