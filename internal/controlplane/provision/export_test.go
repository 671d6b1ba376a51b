package provision

import (
	"context"
	"time"
)

// SetAfterStep sets the hook run after each reconcile step (see the field).
func (p *K8sWorkerProvisioner) SetAfterStep(f func(ctx context.Context, tenant, env, step string) error) {
	p.afterStep = f
}

// SetOrphanAge sets how old an unplaced identity token must be to be
// revoked.
func (p *K8sWorkerProvisioner) SetOrphanAge(d time.Duration) { p.orphanAge = d }

// WorkerDeployment is the worker's Deployment as c writes it.
var WorkerDeployment = deploymentObject
