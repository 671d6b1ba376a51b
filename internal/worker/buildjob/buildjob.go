// Package buildjob makes the Kubernetes Jobs that run a conversation's
// builds, tests and image builds outside the worker pod: GradleJobBuilder (`gradle build`, `gradle test --tests …`)
// and KanikoJobBuilder (an image from a Dockerfile in the working tree),
// both on one shared base, Base.
//
// A Job runs in the tenant-env's namespace, created with the worker's own
// credentials (its Role: batch/jobs create, get, list, watch, delete), and
// is shaped to pass the admission policy talkide-worker-jobs
// (provision.JobPolicy): the namespace's default ServiceAccount with no
// token, no host namespaces or paths, only the session volume
// (claude-sessions, the conversation's working tree by subPath), no
// capabilities beyond Pod Security's baseline, seccomp RuntimeDefault. Its
// name is deterministic (JobName), so a create repeated after a restart
// finds the Job already there instead of starting a second build.
//
// Dispatcher runs Jobs in a namespace: a limit with a queue, one Job per
// conversation at a time, a wait while the namespace's quota refuses a
// Job, create or adopt (never a Job being deleted), a watch to completion
// that survives expired resource versions, a Pending timeout with the
// scheduler's, kubelet's or Job controller's reason, and cancellation that
// deletes the Job with its pod, also one whose create raced it; FollowLogs streams a
// build's log with resume; Reconcile is the pass after a worker restart.
// Results come from the build's JUnit files in the working tree
// (ReadResults), not from logs. LocalRunner runs the same builds, for the
// one-machine platform, as processes on the worker's machine: as the
// agent's user, in a jail like the agent's, offline, with Debian's Gradle
// (local.go; docs/builds.md). The agent's build tool, which starts builds
// and turns them into events, is package buildmcp.
package buildjob

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/talkide/talkide/internal/kubename"
)

// Kind is what a build Job does: KindGradle or KindKaniko.
type Kind string

const (
	KindGradle Kind = "gradle"
	KindKaniko Kind = "kaniko"
)

// Labels every build Job and its pod carry, beside the tenant-env's
// (kubename.LabelTenant, kubename.LabelEnv).
const (
	LabelConversation = "talkide.dev/conversation"
	LabelBuild        = "talkide.dev/build" // the build's id within the conversation
	LabelKind         = "talkide.dev/build-kind"
	LabelComponent    = "app.kubernetes.io/component"
	ComponentBuild    = "build"
)

// WorkspaceMount is where a Job sees the conversation's working tree.
const WorkspaceMount = "/workspace"

// Request is one build of one conversation.
type Request struct {
	Tenant, Env string
	// Conversation is the conversation's id; its working tree is
	// <session volume>/workspaces/<Conversation>.
	Conversation string
	// ID names the build within the conversation (the agent's tool call
	// id): with Conversation it makes the Job's name, so asking twice for
	// the same build never starts two.
	ID string
	// RunAsUser is the conversation's agent uid, which owns its working
	// tree: the build reads and writes it as that user. 0 is refused.
	RunAsUser int64
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func (r Request) validate() error {
	var errs []error
	if !kubename.ValidName(r.Tenant) || !kubename.ValidName(r.Env) {
		errs = append(errs, fmt.Errorf("tenant %q / env %q: want DNS labels", r.Tenant, r.Env))
	}
	if !idPattern.MatchString(r.Conversation) {
		errs = append(errs, fmt.Errorf("conversation %q: want letters, digits, - and _", r.Conversation))
	}
	if !idPattern.MatchString(r.ID) {
		errs = append(errs, fmt.Errorf("build id %q: want letters, digits, - and _", r.ID))
	}
	if r.RunAsUser <= 0 {
		errs = append(errs, fmt.Errorf("run as user %d: want the conversation's agent uid, never root", r.RunAsUser))
	}
	return errors.Join(errs...)
}

// JobName is the Job's name for a build: the kind and a hash of the
// conversation and build id (a Job name is at most 63 characters, a
// conversation id and a tool call id together are not).
func JobName(kind Kind, conversation, id string) string {
	sum := sha256.Sum256([]byte(conversation + "\x00" + id))
	return "build-" + string(kind) + "-" + hex.EncodeToString(sum[:10])
}

// Base is what every build Job shares: its image, resources, limits in
// time and placement. The zero values of durations take the defaults
// noted.
type Base struct {
	// Image is the builder image, pinned by digest (repo@sha256:<64 hex>):
	// a tag can change under a running platform. Required.
	Image string
	// Resources of the build container. Default: requests 1 CPU and 2Gi,
	// limit 4Gi memory (a JVM's heap and its daemon-less Gradle fit).
	Resources corev1.ResourceRequirements
	// ActiveDeadline ends a build that runs longer (the Job fails with
	// DeadlineExceeded). Default 30 minutes.
	ActiveDeadline time.Duration
	// TTLAfterFinished is how long a finished Job (and its pod, with its
	// logs) stays at most: the worker deletes it once its result is
	// delivered (KubeRunner.Release), and this ends one nobody did.
	// Default 1 hour.
	TTLAfterFinished time.Duration
	// NodeSelector and Tolerations put builds on a dedicated node pool
	// (DESIGN open point 3); off by default. A selector may not name a
	// node (kubernetes.io/hostname), and tolerations must name their taint
	// and not tolerate the node lifecycle's or control plane's taints: the
	// admission policy refuses such Jobs, and so does Validate, earlier.
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// Labels are further labels of every build Job and its pod (cost
	// allocation, a cluster's policies); the platform's own labels win over
	// any of the same key.
	Labels map[string]string
}

// Validate applies the defaults and checks b.
func (b *Base) Validate() error {
	var errs []error
	if !kubename.DigestPinned(b.Image) {
		errs = append(errs, fmt.Errorf("builder image %q: want one pinned by digest, repository@sha256:<64 hex digits>", b.Image))
	}
	if _, ok := b.NodeSelector["kubernetes.io/hostname"]; ok {
		errs = append(errs, errors.New("build node selector: may not pick a node by name (kubernetes.io/hostname)"))
	}
	for _, t := range b.Tolerations {
		if t.Key == "" || strings.HasPrefix(t.Key, "node.") || strings.HasPrefix(t.Key, "node-role.kubernetes.io/") || t.Key == "CriticalAddonsOnly" {
			errs = append(errs, fmt.Errorf("build toleration %q: name a taint of the build pool, not every taint or a node's lifecycle or control-plane taint", t.Key))
		}
	}
	if b.Resources.Requests == nil {
		b.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("2Gi")}
	}
	if b.Resources.Limits == nil {
		b.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}
	}
	if b.ActiveDeadline <= 0 {
		b.ActiveDeadline = 30 * time.Minute
	}
	if b.TTLAfterFinished <= 0 {
		b.TTLAfterFinished = time.Hour
	}
	return errors.Join(errs...)
}

// job is the Job of req running c (its image, security context, resources
// and working-tree mount are filled in here) with the further volumes
// extra. root runs the container as uid 0 (in a user namespace of its own:
// Kaniko unpacks images as root); otherwise as req.RunAsUser.
//
// b is a copy: Validate applies the defaults to it, so that concurrent
// builds (one builder serves all of a worker's conversations) only read
// the builder's own Base.
func (b Base) job(req Request, kind Kind, c corev1.Container, extra []corev1.Volume, root bool) (*batchv1.Job, error) {
	if err := errors.Join(b.Validate(), req.validate()); err != nil {
		return nil, err
	}
	labels := map[string]string{}
	maps.Copy(labels, b.Labels)
	maps.Copy(labels, map[string]string{
		kubename.LabelManagedBy: "talkide-worker", kubename.LabelPartOf: kubename.PartOf, LabelComponent: ComponentBuild,
		kubename.LabelTenant: req.Tenant, kubename.LabelEnv: req.Env,
		LabelConversation: req.Conversation, LabelBuild: req.ID, LabelKind: string(kind),
	})
	c.Image = b.Image
	c.ImagePullPolicy = corev1.PullIfNotPresent
	c.Resources = b.Resources
	c.WorkingDir = WorkspaceMount
	c.VolumeMounts = append([]corev1.VolumeMount{{Name: "workspace", MountPath: WorkspaceMount, SubPath: "workspaces/" + req.Conversation}}, c.VolumeMounts...)
	c.SecurityContext = &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	pod := corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		// The namespace's default ServiceAccount, and no token: a build
		// runs the project's own code and has no business with the API.
		AutomountServiceAccountToken: ptr.To(false),
		EnableServiceLinks:           ptr.To(false),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsUser: ptr.To(req.RunAsUser), RunAsGroup: ptr.To(req.RunAsUser), RunAsNonRoot: ptr.To(true),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers:   []corev1.Container{c},
		Volumes:      append([]corev1.Volume{{Name: "workspace", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: kubename.PVCName}}}}, extra...),
		NodeSelector: b.NodeSelector,
		Tolerations:  b.Tolerations,
	}
	if root {
		// Root in a user namespace of the pod's own, never on the node.
		pod.HostUsers = ptr.To(false)
		pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup, pod.SecurityContext.RunAsNonRoot = ptr.To[int64](0), ptr.To[int64](0), ptr.To(false)
		// Kaniko changes file owners and modes while it unpacks layers.
		pod.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID"}
	}
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: JobName(kind, req.Conversation, req.ID), Namespace: kubename.Namespace(req.Tenant, req.Env), Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To[int32](0),
			PodReplacementPolicy:    ptr.To(batchv1.Failed),
			ActiveDeadlineSeconds:   ptr.To(int64(b.ActiveDeadline / time.Second)),
			TTLSecondsAfterFinished: ptr.To(int32(b.TTLAfterFinished / time.Second)),
			Template:                corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod},
		},
	}, nil
}
