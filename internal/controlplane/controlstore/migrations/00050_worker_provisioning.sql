-- +goose Up
-- What the operator asked for each tenant-env's worker (the
-- K8sWorkerProvisioner's desired state; what exists is read from the
-- cluster, never from here). generation grows with every provision and
-- deprovision, so a reconcile started for an older request can tell it was
-- overtaken.
CREATE TABLE workers (
    tenant     TEXT   NOT NULL,
    env        TEXT   NOT NULL,
    desired    TEXT   NOT NULL,
    generation BIGINT NOT NULL,
    last_error TEXT   NOT NULL DEFAULT '',
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, env)
);
-- An identity token replaced by rotation stays valid until retire_at (the
-- grace period), then is revoked.
ALTER TABLE identity_tokens ADD COLUMN retire_at BIGINT;

-- +goose Down
ALTER TABLE identity_tokens DROP COLUMN retire_at;
DROP TABLE workers;
