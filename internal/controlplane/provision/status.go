package provision

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
)

// Phases of a Status.
const (
	PhaseReady          = "Ready"          // every object exists and the Deployment is available with its pods updated
	PhaseProgressing    = "Progressing"    // being made or rolled out
	PhaseFailed         = "Failed"         // cannot become ready without help: Reason and Message say why
	PhaseDeprovisioning = "Deprovisioning" // being removed
	PhaseAbsent         = "Absent"         // nothing of it exists and none is wanted
)

// Status is what the cluster shows of a tenant-env's worker, read when it
// is asked for (never a stored claim). JSON shape of the admin API.
type Status struct {
	Tenant    string `json:"tenant"`
	Env       string `json:"env"`
	Namespace string `json:"namespace"`
	// Desired is "present", "absent", or "" when no provision was ever
	// asked for.
	Desired    string `json:"desired"`
	Generation int64  `json:"generation,omitempty"`
	Phase      string `json:"phase"`
	Reason     string `json:"reason"`
	Message    string `json:"message,omitempty"`
	// Missing lists the worker's objects that do not exist ("Kind/name").
	Missing []string `json:"missing,omitempty"`
	// Replicas is the configured count (TALKIDE_WORKER_REPLICAS); the
	// phase is Ready only when the Deployment asks for as many and has
	// them updated and available.
	Replicas        int32  `json:"replicas"`
	ReadyReplicas   int32  `json:"ready_replicas"`
	UpdatedReplicas int32  `json:"updated_replicas"`
	Image           string `json:"image,omitempty"`
	// WorkerURL is where the control plane reaches the worker.
	WorkerURL string    `json:"worker_url"`
	Identity  *Identity `json:"identity,omitempty"`
	// LastError is the last reconcile's failure ("" when it succeeded).
	LastError string `json:"last_error,omitempty"`
	// Containment is what a ready worker reports of its agent
	// containment: which guarantees its node gives it and which not
	// (GET /v1/worker of the worker; the control plane's admin API fills
	// it in, absent when no worker answered).
	Containment *contract.Containment `json:"containment,omitempty"`
	ObservedAt  time.Time             `json:"observed_at"`
}

// Identity describes the worker's identity tokens (ids and times only).
type Identity struct {
	JTI       string    `json:"jti"`
	ExpiresAt time.Time `json:"expires_at"`
	// Retiring are replaced tokens still valid until their RetireAt.
	Retiring []Retiring `json:"retiring,omitempty"`
}

// Retiring is a replaced identity token in its grace period.
type Retiring struct {
	JTI      string    `json:"jti"`
	RetireAt time.Time `json:"retire_at"`
}

// Status reads the tenant-env's worker from the cluster. The error is
// non-nil only when the cluster or database cannot be read; the status
// then says APIError too.
func (p *K8sWorkerProvisioner) Status(ctx context.Context, tenant, env string) (Status, error) {
	if err := checkNames(tenant, env); err != nil {
		return Status{}, err
	}
	ns := Namespace(tenant, env)
	st := Status{Tenant: tenant, Env: env, Namespace: ns, ObservedAt: p.now().UTC(),
		WorkerURL: strings.NewReplacer("{tenant}", tenant, "{env}", env).Replace(p.cfg.WorkerURLTemplate)}
	fail := func(err error) (Status, error) {
		st.Phase, st.Reason, st.Message = PhaseFailed, ReasonAPIError, err.Error()
		return st, &Error{Reason: ReasonAPIError, Message: "read the worker's objects: " + err.Error(), Err: err}
	}
	rec, err := p.store.WorkerRecord(ctx, tenant, env)
	switch {
	case err == nil:
		st.Desired, st.Generation, st.LastError = rec.Desired, rec.Generation, rec.LastError
	case !errors.Is(err, controlstore.ErrNotFound):
		return fail(err)
	}
	present := st.Desired == controlstore.WorkerPresent
	nsObj, err := p.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if present {
			st.Phase, st.Reason, st.Missing = PhaseProgressing, ReasonObjectsMissing, []string{"Namespace/" + ns}
			st.Message = "namespace " + ns + " does not exist yet"
			if st.LastError != "" {
				st.Phase, st.Message = PhaseFailed, st.LastError
			}
			return st, nil
		}
		st.Phase, st.Reason = PhaseAbsent, ReasonNotProvisioned
		return st, nil
	}
	if err != nil {
		return fail(err)
	}
	if !p.cfg.ownedBy(nsObj.Labels, tenant, env) {
		st.Phase, st.Reason = PhaseAbsent, ReasonNotProvisioned
		if present {
			st.Phase, st.Reason = PhaseFailed, ReasonNamespaceConflict
			st.Message = "namespace " + ns + " exists and is not this tenant-env's"
		}
		return st, nil
	}
	if nsObj.DeletionTimestamp != nil {
		st.Phase, st.Reason, st.Message = PhaseDeprovisioning, ReasonDeprovisioning, terminatingMessage(nsObj, p.now())
		if present {
			st.Phase, st.Reason = PhaseFailed, ReasonNamespaceTerminating
		}
		return st, nil
	}
	if !present {
		st.Phase, st.Reason, st.Message = PhaseDeprovisioning, ReasonDeprovisioning, "namespace "+ns+" is to be deleted"
		return st, nil
	}
	if err := p.observeObjects(ctx, &st); err != nil {
		return fail(err)
	}
	return st, nil
}

// observeObjects fills st from the worker's objects in its live namespace.
func (p *K8sWorkerProvisioner) observeObjects(ctx context.Context, st *Status) error {
	ns := st.Namespace
	core, rbac := p.kube.CoreV1(), p.kube.RbacV1()
	checks := []struct {
		kind, name string
		get        func() error
	}{
		{"ServiceAccount", WorkerName, func() error { _, err := core.ServiceAccounts(ns).Get(ctx, WorkerName, metav1.GetOptions{}); return err }},
		{"Role", WorkerName, func() error { _, err := rbac.Roles(ns).Get(ctx, WorkerName, metav1.GetOptions{}); return err }},
		{"RoleBinding", WorkerName, func() error { _, err := rbac.RoleBindings(ns).Get(ctx, WorkerName, metav1.GetOptions{}); return err }},
		{"Service", WorkerName, func() error { _, err := core.Services(ns).Get(ctx, WorkerName, metav1.GetOptions{}); return err }},
		{"NetworkPolicy", WorkerName, func() error {
			_, err := p.kube.NetworkingV1().NetworkPolicies(ns).Get(ctx, WorkerName, metav1.GetOptions{})
			return err
		}},
		{"ResourceQuota", QuotaName, func() error {
			_, err := core.ResourceQuotas(ns).Get(ctx, QuotaName, metav1.GetOptions{})
			return err
		}},
		{"NetworkPolicy", JobsNetworkPolicyName, func() error {
			_, err := p.kube.NetworkingV1().NetworkPolicies(ns).Get(ctx, JobsNetworkPolicyName, metav1.GetOptions{})
			return err
		}},
	}
	for _, c := range checks {
		if err := c.get(); apierrors.IsNotFound(err) {
			st.Missing = append(st.Missing, c.kind+"/"+c.name)
		} else if err != nil {
			return err
		}
	}
	sec, err := core.Secrets(ns).Get(ctx, SecretName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		st.Missing = append(st.Missing, "Secret/"+SecretName)
	case err != nil:
		return err
	default:
		if c, err := p.verifyIdentity(string(sec.Data[SecretKeyID]), st.Tenant, st.Env); err == nil {
			st.Identity = &Identity{JTI: c.ID, ExpiresAt: c.ExpiresAt.UTC()}
			if toks, err := p.store.LiveIdentityTokens(ctx, st.Tenant, st.Env); err == nil {
				for _, t := range toks {
					if t.JTI != c.ID && t.RetireAt != nil {
						st.Identity.Retiring = append(st.Identity.Retiring, Retiring{JTI: t.JTI, RetireAt: *t.RetireAt})
					}
				}
			}
		}
	}
	var failed []string
	pvc, err := core.PersistentVolumeClaims(ns).Get(ctx, PVCName, metav1.GetOptions{})
	var pvcPending string
	switch {
	case apierrors.IsNotFound(err):
		st.Missing = append(st.Missing, "PersistentVolumeClaim/"+PVCName)
	case err != nil:
		return err
	case pvc.DeletionTimestamp != nil:
		st.Phase, st.Reason = PhaseFailed, ReasonPVCTerminating
		failed = append(failed, "PersistentVolumeClaim "+PVCName+" is being deleted")
	case pvc.Status.Phase != corev1.ClaimBound:
		pvcPending = fmt.Sprintf("PersistentVolumeClaim %s is %s", PVCName, pvc.Status.Phase)
	}
	dep, err := p.kube.AppsV1().Deployments(ns).Get(ctx, WorkerName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		st.Missing = append(st.Missing, "Deployment/"+WorkerName)
		dep = nil
	} else if err != nil {
		return err
	}
	// Replicas is what the operator configured: the Deployment's own count
	// can be changed behind the provisioner's back (scaled to zero).
	st.Replicas = p.cfg.Replicas
	if dep != nil {
		st.ReadyReplicas, st.UpdatedReplicas = dep.Status.ReadyReplicas, dep.Status.UpdatedReplicas
		if len(dep.Spec.Template.Spec.Containers) > 0 {
			st.Image = dep.Spec.Template.Spec.Containers[0].Image
		}
	}
	sort.Strings(st.Missing)
	switch {
	case st.Reason == ReasonPVCTerminating:
		st.Message = strings.Join(failed, "; ")
	case len(st.Missing) > 0:
		st.Phase, st.Reason = PhaseProgressing, ReasonObjectsMissing
		st.Message = "missing: " + strings.Join(st.Missing, ", ")
		if st.LastError != "" {
			st.Phase, st.Message = PhaseFailed, st.Message+"; last reconcile: "+st.LastError
		}
	default:
		p.deploymentPhase(ctx, st, dep, pvcPending)
	}
	return nil
}

// deploymentPhase sets st's phase from the Deployment and, when it is not
// available, from its pods.
func (p *K8sWorkerProvisioner) deploymentPhase(ctx context.Context, st *Status, dep *appsv1.Deployment, pvcPending string) {
	for _, c := range dep.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded" {
			st.Phase, st.Reason, st.Message = PhaseFailed, ReasonDeadlineExceeded, c.Message
			return
		}
		if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
			st.Phase, st.Reason, st.Message = PhaseFailed, ReasonReplicaFailure, c.Message
			return
		}
	}
	want := st.Replicas
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != want {
		have := int32(1) // the API server's default
		if dep.Spec.Replicas != nil {
			have = *dep.Spec.Replicas
		}
		st.Phase, st.Reason = PhaseProgressing, ReasonRollingOut
		st.Message = fmt.Sprintf("the Deployment asks for %d replicas, not the %d configured (changed outside the provisioner): the next reconcile restores it", have, want)
		return
	}
	if dep.Status.ObservedGeneration >= dep.Generation && dep.Status.UpdatedReplicas == want &&
		dep.Status.AvailableReplicas >= want && dep.Status.Replicas == want {
		st.Phase, st.Reason = PhaseReady, ReasonAvailable
		if st.LastError != "" {
			// Running, but not as configured: the last reconcile failed.
			st.Phase, st.Reason, st.Message = PhaseFailed, ReasonReconcileFailed, "the worker runs, but the last reconcile failed: "+st.LastError
		}
		return
	}
	st.Phase, st.Reason = PhaseProgressing, ReasonRollingOut
	st.Message = fmt.Sprintf("%d of %d replicas updated, %d available", dep.Status.UpdatedReplicas, want, dep.Status.AvailableReplicas)
	if pvcPending != "" {
		st.Message += "; " + pvcPending
	}
	pods, err := p.kube.CoreV1().Pods(st.Namespace).List(ctx, metav1.ListOptions{LabelSelector: k8slabels.SelectorFromSet(podSelector(st.Tenant, st.Env)).String()})
	if err != nil {
		return
	}
	for _, pod := range pods.Items {
		if why, fatal := podProblem(&pod); why != "" {
			st.Message += "; pod " + pod.Name + ": " + why
			if fatal {
				st.Phase, st.Reason = PhaseFailed, ReasonPodNotReady
			}
			return
		}
	}
}

// runtimeHint turns a runtime's error that has a known cause into what an
// operator can do about it ("" for others).
func runtimeHint(msg string) string {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "idmap") || strings.Contains(m, "mount_setattr"):
		return " (the session volume's filesystem does not support idmapped mounts, as NFS does not, so a pod in a user namespace cannot mount it: " +
			"set TALKIDE_WORKER_USER_NAMESPACE=false (the chart's worker.userNamespace), or use a storage class whose filesystem supports idmapped mounts; docs/deploying.md)"
	case strings.Contains(m, "user namespace") && (strings.Contains(m, "not supported") || strings.Contains(m, "does not support")):
		return " (this node's runtime cannot run pods in user namespaces: set TALKIDE_WORKER_USER_NAMESPACE=false (the chart's worker.userNamespace), or place workers on nodes that can; docs/deploying.md)"
	}
	return ""
}

// podProblem says why pod is not ready, and whether it will not get there
// by itself (an image that cannot be pulled, a crash loop, a bad config).
func podProblem(pod *corev1.Pod) (string, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "not scheduled: " + c.Reason + ": " + c.Message, false
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			switch w.Reason {
			case "ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "CreateContainerConfigError", "InvalidImageName", "CreateContainerError":
				msg := w.Message
				// A crash loop's cause is its last exit: the runtime's refusal
				// to start it, or the worker's own last words.
				if last := cs.LastTerminationState.Terminated; last != nil && w.Reason == "CrashLoopBackOff" {
					msg += "; last exit: " + last.Reason
					if last.Message != "" {
						msg += ": " + last.Message
					}
				}
				return "container " + cs.Name + ": " + w.Reason + ": " + msg + runtimeHint(msg), true
			}
			return "container " + cs.Name + ": " + w.Reason, false
		}
	}
	return "", false
}
