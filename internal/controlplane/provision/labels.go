package provision

import (
	"fmt"

	"github.com/talkide/talkide/internal/kubename"
)

// Labels on every object the provisioner makes.
const (
	// The labels the worker's build Jobs carry too (package kubename).
	LabelManagedBy = kubename.LabelManagedBy
	LabelPartOf    = kubename.LabelPartOf
	PartOf         = kubename.PartOf
	LabelTenant    = kubename.LabelTenant
	LabelEnv       = kubename.LabelEnv

	ManagedBy = "talkide-controlplane"
	LabelName = "app.kubernetes.io/name"
	// LabelInstallation names the control-plane installation (its
	// database) that made an object: two installations sharing a cluster
	// never adopt or remove each other's workers.
	LabelInstallation = "talkide.dev/installation"
	// LabelInstallationID is the id of the control-plane database whose
	// records an object answers to: a control plane with another database
	// (a second installation, a restored or empty one) never adopts or
	// removes it.
	LabelInstallationID = "talkide.dev/installation-id"
)

// Names of the worker's objects in its namespace.
const (
	WorkerName    = "talkide-worker"           // ServiceAccount, Role, RoleBinding, Deployment, Service, NetworkPolicy
	SecretName    = "talkide-worker-token"     // identity token and request keys
	PVCName       = kubename.PVCName           // the session volume
	SecretKeyID   = "identity-token"           // key of the identity token in SecretName
	SecretKeyReq  = "request-keys"             // key of the worker's request keys in SecretName
	SessionMount  = "/data/claude"             // where PVCName is mounted
	IdentityMount = "/var/run/secrets/talkide" // where SecretName's identity token is mounted
	WorkerPort    = 8080
)

// Namespace is the namespace of a tenant-env's worker (kubename.Namespace).
func Namespace(tenant, env string) string { return kubename.Namespace(tenant, env) }

// labels are the labels of a tenant-env's objects.
func (c *Config) labels(tenant, env string) map[string]string {
	return map[string]string{
		LabelManagedBy: ManagedBy, LabelPartOf: PartOf, LabelName: WorkerName,
		LabelTenant: tenant, LabelEnv: env, LabelInstallation: c.Installation, LabelInstallationID: c.installationID,
	}
}

// ownedBy reports whether labels l mark an object of this installation's
// tenant-env.
func (c *Config) ownedBy(l map[string]string, tenant, env string) bool {
	return l[LabelManagedBy] == ManagedBy && l[LabelInstallation] == c.Installation && l[LabelInstallationID] == c.installationID &&
		l[LabelTenant] == tenant && l[LabelEnv] == env
}

// podSelector is the label selector of the worker's pods.
func podSelector(tenant, env string) map[string]string {
	return map[string]string{LabelName: WorkerName, LabelTenant: tenant, LabelEnv: env}
}

// ValidName reports whether s may be a tenant or env name
// (kubename.ValidName).
func ValidName(s string) bool { return kubename.ValidName(s) }

func checkNames(tenant, env string) error {
	if !ValidName(tenant) || !ValidName(env) {
		return &Error{Reason: ReasonInvalid, Message: fmt.Sprintf("tenant %q, env %q: want DNS labels of at most 30 characters ([a-z0-9-])", tenant, env)}
	}
	return nil
}
