package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/kubename"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/buildmcp"
	"github.com/talkide/talkide/internal/worker/harness"
	"github.com/talkide/talkide/internal/worker/sandbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// Build modes of BuildConfig.Mode.
const (
	BuildsKubernetes = "kubernetes"
	BuildsLocal      = "local"
	BuildsOff        = "off"
)

// BuildConfig configures the agent's build tool, talkide-build (package
// buildmcp): where builds run and with what. Zero values take the
// defaults noted.
type BuildConfig struct {
	// Mode is "kubernetes" (a Job per build in the worker's namespace,
	// with the worker's own credentials), "local" (a contained process on
	// this machine, with Debian's gradle) or "off" [TALKIDE_BUILDS].
	// Default: kubernetes when Image is set; else off in a pod
	// (KUBERNETES_SERVICE_HOST set: builds never run inside the worker
	// pod) and local elsewhere.
	Mode string
	// Image is the Gradle builder image of build Jobs, pinned by digest
	// [TALKIDE_BUILD_IMAGE]; `make images` builds talkide-builder-gradle.
	Image string
	// MaxConcurrent builds at once in the tenant-env; more wait in a queue
	// [TALKIDE_BUILD_MAX_CONCURRENT]. Default 2 (kubernetes), 1 (local).
	MaxConcurrent int
	// Timeout ends a build that runs longer [TALKIDE_BUILD_TIMEOUT, a Go
	// duration]. Default 30 minutes.
	Timeout time.Duration
	// PendingTimeout ends a build Job whose pod is not running this long
	// after it was made (unschedulable, image not pullable)
	// [TALKIDE_BUILD_PENDING_TIMEOUT]. Default 5 minutes.
	PendingTimeout time.Duration
	// NodeSelector and Tolerations put build Jobs on a dedicated node pool
	// [TALKIDE_BUILD_NODE_SELECTOR "key=value,…", TALKIDE_BUILD_TOLERATIONS
	// "key=value:Effect,key:Effect,…"]. Default: none.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// Gradle is the gradle binary of local builds [TALKIDE_BUILD_GRADLE].
	// Default: gradle on PATH.
	Gradle string
}

// ParseTolerations reads "key=value:Effect,key:Effect" (kubename.ParseTolerations).
func ParseTolerations(s string) ([]corev1.Toleration, error) { return kubename.ParseTolerations(s) }

// ParseSelector reads "key=value,key=value" (kubename.ParseSelector).
func ParseSelector(s string) (map[string]string, error) { return kubename.ParseSelector(s) }

// builds is the worker's build tool: its MCP server and, for Kubernetes,
// the dispatcher whose Jobs Recover reconciles.
type builds struct {
	server *buildmcp.Server
	jobs   buildmcp.JobReconciler // nil for local builds
}

// newBuilds sets up the build tool of c. A mode that cannot work here is
// not an error: the tool is offered and answers why builds are off, and
// the reason is logged (a worker runs its conversations without builds).
// Errors are for a configuration that is wrong: a malformed image, node
// selector or toleration.
func newBuilds(c Config, store *sessionstore.Store, jail *sandbox.Jail, kube func() (kubernetes.Interface, string, error), log *slog.Logger) (*builds, error) {
	bc := c.Builds
	log = log.With("component", "builds")
	cfg := buildmcp.Config{Tenant: c.Tenant, Env: c.Env, Records: store, Logger: log}
	b := &builds{}
	mode := bc.Mode
	switch {
	case mode != "":
	case bc.Image != "":
		mode = BuildsKubernetes
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		// In a pod without a builder image: a local Gradle would run inside
		// the worker pod, which is what build Jobs exist to avoid.
		mode = BuildsOff
		cfg.Unavailable = "the operator has configured no builder image for build Jobs (chart value builds.gradleImage, or TALKIDE_BUILD_IMAGE)."
	default:
		mode = BuildsLocal
	}
	workspaces := filepath.Join(c.SessionDir, "workspaces")
	switch mode {
	case BuildsOff:
		if cfg.Unavailable == "" {
			cfg.Unavailable = "the operator turned builds off (TALKIDE_BUILDS=off)."
		}
	case BuildsKubernetes:
		g := &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: bc.Image, ActiveDeadline: bc.Timeout, NodeSelector: bc.NodeSelector, Tolerations: bc.Tolerations}}
		if err := g.Validate(); err != nil {
			return nil, fmt.Errorf("TALKIDE_BUILD_*: %w", err)
		}
		cs, ns, err := kube()
		if err != nil {
			log.Error("build Jobs are off: no Kubernetes credentials", "err", err)
			cfg.Unavailable = "the worker has no Kubernetes credentials to start build Jobs; the operator must fix the worker's ServiceAccount."
			break
		}
		d := &buildjob.Dispatcher{Kube: cs, Namespace: ns, MaxConcurrent: bc.MaxConcurrent, PendingTimeout: bc.PendingTimeout, Logger: log}
		cfg.Runner = &buildjob.KubeRunner{Dispatcher: d, Gradle: g, WorkspaceRoot: workspaces, Offline: true}
		cfg.RunnerName = buildjob.RunnerKubernetes
		b.jobs = d
		log.Info("builds run as Kubernetes Jobs", "namespace", ns, "image", bc.Image, "max_concurrent", bc.MaxConcurrent)
	case BuildsLocal:
		r, err := newLocalRunner(bc, workspaces, jail, c.AgentLimits.DiskBytes, log)
		if err != nil {
			log.Warn("local builds are off", "err", err)
			cfg.Unavailable = err.Error()
			break
		}
		cfg.Runner, cfg.RunnerName = r, buildjob.RunnerLocal
		log.Info("builds run as contained local processes")
	default:
		return nil, fmt.Errorf("TALKIDE_BUILDS %q: want kubernetes, local or off", bc.Mode)
	}
	b.server = buildmcp.New(cfg)
	return b, nil
}

// run delivers the results of builds a restart cut off, now and every
// minute, until ctx ends.
func (b *builds) run(ctx context.Context, h *harness.Harness) {
	deliver := func(conv string, t contract.EventType, payload any) error {
		err := h.Emit(conv, t, payload)
		if errors.Is(err, harness.ErrNotFound) {
			return fmt.Errorf("%w: %w", buildmcp.ErrGone, err)
		}
		return err
	}
	b.server.Run(ctx, deliver, b.jobs, time.Minute)
}

// agentUID is the uid a conversation's builds run as: its agent's, or the
// worker's own when agents run as the worker.
func agentUID(u *sandbox.User) int64 {
	if u != nil {
		return int64(u.UID)
	}
	return int64(os.Getuid())
}
