-- +goose Up
-- The newest control-plane configuration running (TALKIDE_CONFIG_REVISION,
-- the Helm release revision), when a control plane of it was last seen
-- (unix ms), and how long after that it gives way (ms, its own setting):
-- control planes of an older revision leave the workers to it while it is
-- seen (provision.Config.ConfigRevision).
CREATE TABLE config_revision (
    id       INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    revision BIGINT  NOT NULL,
    seen_at  BIGINT  NOT NULL,
    stale_ms BIGINT  NOT NULL
);

-- +goose Down
DROP TABLE config_revision;
