package provision

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/kubename"
)

// Config is the K8sWorkerProvisioner's configuration. The control plane
// reads it from the environment (names in brackets; see
// controlplane.Config). Zero values take the defaults noted.
type Config struct {
	// Installation names this control-plane installation in the labels of
	// what it makes [TALKIDE_INSTALLATION, a DNS label]. Default "talkide".
	// Give each installation sharing a cluster its own.
	Installation string
	// Image is the worker image [TALKIDE_WORKER_IMAGE]. Required to
	// provision (Provision refuses without it; status and deprovision work).
	Image string
	// ImagePullPolicy [TALKIDE_WORKER_IMAGE_PULL_POLICY]. Default
	// IfNotPresent.
	ImagePullPolicy corev1.PullPolicy
	// BuildImage is the image of the build Jobs a worker runs, the Gradle
	// builder (`make images`: talkide-builder-gradle), pinned by digest
	// (repository@sha256:<64 hex>) [TALKIDE_WORKER_BUILD_IMAGE]. Each
	// worker gets it as TALKIDE_BUILD_IMAGE; a new one rolls the workers.
	// Empty (the default): no worker gets the setting, and builds in
	// Kubernetes are off.
	BuildImage string
	// Replicas of each worker Deployment [TALKIDE_WORKER_REPLICAS]. Default
	// 1; a rolling update adds one more for its duration.
	Replicas int32
	// StorageClass of the claude-sessions PVC, which must offer
	// ReadWriteMany [TALKIDE_WORKER_STORAGE_CLASS]. Default: the cluster's
	// default class.
	StorageClass string
	// StorageSize requested for the PVC [TALKIDE_WORKER_STORAGE_SIZE].
	// Default 10Gi. Applied at creation only (a PVC's size grows only where
	// its class allows expansion).
	StorageSize resource.Quantity
	// Resources of the worker container [TALKIDE_WORKER_CPU_REQUEST,
	// TALKIDE_WORKER_MEMORY_REQUEST, TALKIDE_WORKER_CPU_LIMIT,
	// TALKIDE_WORKER_MEMORY_LIMIT]. Default: requests 500m CPU and 2Gi,
	// limit 8Gi memory (one worker runs up to TALKIDE_MAX_PROCESSES CLI
	// processes of several hundred MB each).
	Resources corev1.ResourceRequirements
	// GatewayURL is the control plane's base URL as workers reach it: the
	// worker's TALKIDE_GATEWAY_BASE_URL [TALKIDE_WORKER_GATEWAY_URL].
	// Default http://talkide-controlplane.{ControlPlaneNamespace}.svc.cluster.local:8080.
	GatewayURL string
	// ControlPlaneNamespace is where the control plane's pods run
	// [TALKIDE_NAMESPACE, else POD_NAMESPACE]. Default talkide-system.
	ControlPlaneNamespace string
	// ControlPlaneLabels select the control plane's pods in that namespace,
	// for the worker's NetworkPolicy [TALKIDE_CONTROLPLANE_POD_LABELS,
	// "k=v,k=v"]. Default app.kubernetes.io/name=talkide-controlplane.
	ControlPlaneLabels map[string]string
	// APIServerCIDRs are where the Kubernetes API server is, for the
	// NetworkPolicy's egress rule [TALKIDE_WORKER_APISERVER_CIDRS]. Default:
	// the addresses of EndpointSlice default/kubernetes.
	APIServerCIDRs []string
	// EgressCIDRs are further destinations every worker (and so its agents)
	// may reach, e.g. a package mirror [TALKIDE_WORKER_EGRESS_CIDRS].
	// Default none: the worker reaches only the control plane, DNS, the API
	// server and its own replicas.
	EgressCIDRs []string
	// Env is further worker settings, copied into the worker's environment
	// [TALKIDE_WORKER_ENV, "NAME=value,..."; only TALKIDE_* names, not the
	// ones the provisioner sets itself].
	Env []corev1.EnvVar
	// MaxJobs bounds the Jobs a worker's namespace may hold at once (its
	// ResourceQuota; pods are bounded at MaxJobs plus the worker's
	// replicas during a rolling update) [TALKIDE_WORKER_MAX_JOBS].
	// Default 16.
	MaxJobs int
	// HostUIDDir is the hostPath every worker of a node shares for agent
	// uid claims [TALKIDE_WORKER_HOST_UID_DIR]. Default /run/talkide/uids.
	// Not mounted with UserNamespace (each pod's uids are its own there).
	HostUIDDir string
	// UserNamespace runs the worker's pod in a user namespace of its own
	// (hostUsers: false, with an unmasked /proc): the worker's root is an
	// unprivileged uid on the node, and each agent gets a /proc of its
	// own [TALKIDE_WORKER_USER_NAMESPACE, true or false]. Default false:
	// the pod then mounts any session volume, NFS included, which has no
	// idmapped mounts and so cannot be mounted by such a pod
	// (docs/deploying.md, "Choosing the worker's pod"). Set it when the
	// session volume's filesystem supports idmapped mounts (and the
	// nodes' runtime user namespaces).
	UserNamespace bool
	// RuntimeClass is the worker pod's runtimeClassName, e.g. one whose
	// handler makes the pod's cgroup writable (containerd's
	// cgroup_writable), which gives each agent a control group of its
	// own [TALKIDE_WORKER_RUNTIME_CLASS]. Default: the cluster's default.
	RuntimeClass string
	// NodeSelector and Tolerations place the worker pods on a node pool
	// [TALKIDE_WORKER_NODE_SELECTOR "key=value,...",
	// TALKIDE_WORKER_TOLERATIONS "key=value:Effect,..."]. Default none.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// ContainmentRequire are agent-containment guarantees (contract.
	// Guarantees) every worker must give or refuse to start: the worker's
	// TALKIDE_CONTAINMENT_REQUIRE [TALKIDE_WORKER_CONTAINMENT_REQUIRE,
	// comma-separated]. Default none: workers start with what their nodes
	// give and report the rest.
	ContainmentRequire []string
	// IdentityTTL is the life of a worker's identity token
	// [TALKIDE_IDENTITY_TTL]. Default 90 days.
	IdentityTTL time.Duration
	// RotateBefore is how long before its expiry an identity token is
	// replaced [TALKIDE_IDENTITY_ROTATE_BEFORE]. Default 30 days.
	RotateBefore time.Duration
	// Grace is how long a replaced identity token stays valid, for every
	// worker pod to read its successor from the Secret (kubelet refreshes
	// mounted Secrets within about a minute)
	// [TALKIDE_IDENTITY_ROTATION_GRACE]. Default 1h; less than RotateBefore.
	Grace time.Duration
	// TerminatingWait is how long a provision waits for a namespace or PVC
	// still being deleted before it reports so and leaves the retry to the
	// resync [TALKIDE_PROVISION_WAIT]. Default 60s.
	TerminatingWait time.Duration
	// Resync is the period at which Run queues every tenant-env again, a
	// backstop to its watches [TALKIDE_PROVISION_RESYNC]. Default 30s.
	Resync time.Duration
	// WorkerURLTemplate is how the control plane reaches a worker, {tenant}
	// and {env} replaced (reported in Status). Default
	// http://talkide-worker.{tenant}-{env}.svc.cluster.local:8080.
	WorkerURLTemplate string
	// ConfigRevision orders control-plane configurations
	// [TALKIDE_CONFIG_REVISION; the chart sets the Helm release revision].
	// A control plane leaves the workers alone (its provisions and resyncs
	// answer OutdatedConfig) once one of a higher revision has started with
	// the same database and while it is seen (its Run says so every few
	// seconds once it serves; unseen for a minute with the default Resync,
	// as after an uninstall whose reinstall starts again at revision 1, it
	// gives way), so a rolling
	// update rolls each worker once, to the new image. 0 (the default):
	// unordered, never refused.
	ConfigRevision int64
	Logger         *slog.Logger

	// installationID is the database's (controlstore InstallationID): set
	// by New, part of every object's labels.
	installationID string
}

// revisionHeartbeat is how often a running control plane says its
// configuration revision is seen: a third of the resync period, between
// 1 and 10 seconds.
func (c *Config) revisionHeartbeat() time.Duration {
	return min(max(c.Resync/3, time.Second), 10*time.Second)
}

// revisionSettle is how long a serving control plane runs before it
// claims its configuration revision: three heartbeats.
func (c *Config) revisionSettle() time.Duration { return 3 * c.revisionHeartbeat() }

// revisionStale is how long a configuration revision stays in charge
// unseen: six heartbeats (a minute by default).
func (c *Config) revisionStale() time.Duration { return 6 * c.revisionHeartbeat() }

// reserved are the worker settings the provisioner sets itself.
var reserved = map[string]bool{
	"TALKIDE_TENANT": true, "TALKIDE_ENV": true, "TALKIDE_WORKER_ADDR": true, "TALKIDE_WORKER_REQUEST_KEYS": true,
	"TALKIDE_WORKER_IDENTITY_TOKEN": true, "TALKIDE_WORKER_IDENTITY_TOKEN_FILE": true, "TALKIDE_GATEWAY_BASE_URL": true,
	"TALKIDE_SESSION_DIR": true, "TALKIDE_LEASE_BACKEND": true, "TALKIDE_WORKER_ID": true, "TALKIDE_HOST_UID_DIR": true,
	"TALKIDE_CONTAINMENT": true, "TALKIDE_BUILD_IMAGE": true, "TALKIDE_CONTAINMENT_REQUIRE": true,
}

// DigestPinned reports whether image is pinned by digest
// (kubename.DigestPinned).
func DigestPinned(image string) bool { return kubename.DigestPinned(image) }

// ParseEnv parses TALKIDE_WORKER_ENV ("NAME=value,...").
func ParseEnv(s string) ([]corev1.EnvVar, error) {
	var out []corev1.EnvVar
	for kv := range strings.SplitSeq(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "TALKIDE_") {
			return nil, fmt.Errorf("%q: want TALKIDE_NAME=value", kv)
		}
		if reserved[name] {
			return nil, fmt.Errorf("%s is set by the provisioner", name)
		}
		out = append(out, corev1.EnvVar{Name: name, Value: val})
	}
	return out, nil
}

// Validate applies the defaults and checks c.
func (c *Config) Validate() error {
	var errs []error
	if c.Installation == "" {
		c.Installation = "talkide"
	}
	if !ValidName(c.Installation) {
		errs = append(errs, fmt.Errorf("TALKIDE_INSTALLATION %q: want a DNS label of at most 30 characters", c.Installation))
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if c.BuildImage != "" && !DigestPinned(c.BuildImage) {
		errs = append(errs, fmt.Errorf("TALKIDE_WORKER_BUILD_IMAGE %q: want an image pinned by digest, repository@sha256:<64 hex digits>, or unset (no builds in Kubernetes)", c.BuildImage))
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxJobs <= 0 {
		c.MaxJobs = 16
	}
	if c.StorageSize.IsZero() {
		c.StorageSize = resource.MustParse("10Gi")
	}
	if c.Resources.Requests == nil {
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("2Gi")}
	}
	if c.Resources.Limits == nil {
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}
	}
	if c.ControlPlaneNamespace == "" {
		c.ControlPlaneNamespace = "talkide-system"
	}
	if len(c.ControlPlaneLabels) == 0 {
		c.ControlPlaneLabels = map[string]string{LabelName: "talkide-controlplane"}
	}
	if c.GatewayURL == "" {
		c.GatewayURL = "http://talkide-controlplane." + c.ControlPlaneNamespace + ".svc.cluster.local:8080"
	}
	for _, e := range c.Env {
		if reserved[e.Name] || !strings.HasPrefix(e.Name, "TALKIDE_") {
			errs = append(errs, fmt.Errorf("TALKIDE_WORKER_ENV: %s may not be set there", e.Name))
		}
	}
	if c.HostUIDDir == "" {
		c.HostUIDDir = "/run/talkide/uids"
	}
	if d := c.HostUIDDir; !path.IsAbs(d) || path.Clean(d) != d || !(strings.HasPrefix(d, hostUIDPrefixRun) || strings.HasPrefix(d, hostUIDPrefixVar)) {
		// It is a hostPath mounted writable into every worker pod: never
		// the node's /, /etc or another system directory (ScopePolicy
		// refuses any other).
		errs = append(errs, fmt.Errorf("TALKIDE_WORKER_HOST_UID_DIR %q: want a clean absolute path below %s or %s (default /run/talkide/uids)", d, hostUIDPrefixRun, hostUIDPrefixVar))
	}
	if c.RuntimeClass != "" && !ValidName(c.RuntimeClass) && !validSubdomain(c.RuntimeClass) {
		errs = append(errs, fmt.Errorf("TALKIDE_WORKER_RUNTIME_CLASS %q: want a RuntimeClass name", c.RuntimeClass))
	}
	for _, g := range c.ContainmentRequire {
		if !slices.Contains(contract.Guarantees, g) {
			errs = append(errs, fmt.Errorf("TALKIDE_WORKER_CONTAINMENT_REQUIRE: %q is no guarantee (want some of %s)", g, strings.Join(contract.Guarantees, ", ")))
		}
	}
	if _, ok := c.NodeSelector["kubernetes.io/hostname"]; ok {
		errs = append(errs, errors.New("TALKIDE_WORKER_NODE_SELECTOR: may not pick a node by name (kubernetes.io/hostname); label a pool of nodes instead"))
	}
	for _, t := range c.Tolerations {
		if !allowedToleration(t) {
			errs = append(errs, fmt.Errorf("TALKIDE_WORKER_TOLERATIONS: %q may not be tolerated (an empty key tolerates every taint; node.*, node-role.kubernetes.io/* and CriticalAddonsOnly guard unhealthy, control-plane and system nodes)", t.Key))
		}
	}
	for _, cidr := range append(append([]string{}, c.EgressCIDRs...), c.APIServerCIDRs...) {
		if _, _, err := net.ParseCIDR(cidr); err != nil {
			errs = append(errs, fmt.Errorf("TALKIDE_WORKER_EGRESS_CIDRS / TALKIDE_WORKER_APISERVER_CIDRS: %q is not a CIDR like 10.0.0.0/8", cidr))
		}
	}
	if c.IdentityTTL <= 0 {
		c.IdentityTTL = 90 * 24 * time.Hour
	}
	if c.RotateBefore <= 0 {
		c.RotateBefore = 30 * 24 * time.Hour
	}
	if c.Grace <= 0 {
		c.Grace = time.Hour
	}
	if c.RotateBefore >= c.IdentityTTL {
		errs = append(errs, fmt.Errorf("TALKIDE_IDENTITY_ROTATE_BEFORE %v: want less than the token's life %v", c.RotateBefore, c.IdentityTTL))
	}
	if c.Grace >= c.RotateBefore {
		errs = append(errs, fmt.Errorf("TALKIDE_IDENTITY_ROTATION_GRACE %v: want less than TALKIDE_IDENTITY_ROTATE_BEFORE %v (the old token must outlive its grace)", c.Grace, c.RotateBefore))
	}
	if c.TerminatingWait <= 0 {
		c.TerminatingWait = time.Minute
	}
	if c.Resync <= 0 {
		c.Resync = 30 * time.Second
	}
	if c.WorkerURLTemplate == "" {
		c.WorkerURLTemplate = "http://talkide-worker.{tenant}-{env}.svc.cluster.local:8080"
	}
	if c.ConfigRevision < 0 {
		errs = append(errs, fmt.Errorf("TALKIDE_CONFIG_REVISION %d: want a positive integer, or unset", c.ConfigRevision))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return errors.Join(errs...)
}

var subdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// validSubdomain reports whether s is a DNS subdomain (a RuntimeClass name).
func validSubdomain(s string) bool { return len(s) <= 253 && subdomainRE.MatchString(s) }

// allowedToleration is what a worker pod (and ScopePolicy) may tolerate:
// a named taint, not those of unhealthy, control-plane or system nodes.
func allowedToleration(t corev1.Toleration) bool {
	return t.Key != "" && !strings.HasPrefix(t.Key, "node.") && !strings.HasPrefix(t.Key, "node-role.kubernetes.io/") && t.Key != "CriticalAddonsOnly"
}

// Reasons of a Status or an Error: one CamelCase word, as Kubernetes
// conditions have.
const (
	ReasonAvailable            = "Available"            // Ready
	ReasonRollingOut           = "RollingOut"           // Progressing: the Deployment's pods are not all updated and available
	ReasonObjectsMissing       = "ObjectsMissing"       // Progressing/Failed: some of the worker's objects do not exist
	ReasonNamespaceTerminating = "NamespaceTerminating" // the namespace is still being deleted
	ReasonPVCTerminating       = "PVCTerminating"       // the previous claude-sessions PVC is still being deleted
	ReasonNamespaceConflict    = "NamespaceConflict"    // the namespace exists and is not this tenant-env's
	ReasonDeadlineExceeded     = "ProgressDeadlineExceeded"
	ReasonReplicaFailure       = "ReplicaFailure"
	ReasonPodNotReady          = "PodNotReady" // with the pod's own reason in the message
	ReasonNotProvisioned       = "NotProvisioned"
	ReasonDeprovisioning       = "Deprovisioning"
	ReasonSuperseded           = "Superseded" // a later provision or deprovision took over
	ReasonInvalid              = "Invalid"
	ReasonAPIError             = "APIError"        // the cluster refused or could not be reached
	ReasonReconcileFailed      = "ReconcileFailed" // the worker runs, but the last reconcile failed (last_error)
	ReasonPolicyMissing        = "PolicyMissing"   // an admission policy (on workers' Jobs, or the control plane's scope) is not installed or not enforced
	ReasonOutdatedConfig       = "OutdatedConfig"  // a control plane of a newer configuration revision keeps the workers
)

// Error is a provisioning failure with its Reason.
type Error struct {
	Reason  string
	Message string
	Err     error
}

func (e *Error) Error() string {
	if e.Err != nil && e.Message == "" {
		return e.Reason + ": " + e.Err.Error()
	}
	return e.Reason + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }
