package buildjob

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
)

// Outcome phases.
const (
	PhaseSucceeded = "succeeded"
	PhaseFailed    = "failed"
	PhaseCancelled = "cancelled"
	// PhaseDetached: the follower stopped (Hooks.Detach), the build goes on.
	PhaseDetached = "detached"
)

// Outcome is how a build Job ended. Reason is one CamelCase word: the
// Job's own failure reason (DeadlineExceeded, BackoffLimitExceeded, …), or
// Unschedulable, ImagePullBackOff (or the pod's other waiting reason) when
// it stayed Pending past Dispatcher.PendingTimeout, or Cancelled.
type Outcome struct {
	Job     string `json:"job"`
	Phase   string `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Progress is what a build reports while it waits or runs: Queued with
// its place (1: next), then Started once its Job exists.
type Progress struct {
	Queued   int    `json:"queued,omitempty"`
	Started  bool   `json:"started,omitempty"`
	Adopted  bool   `json:"adopted,omitempty"` // the Job existed already (a restart, a repeated request)
	PodPhase string `json:"pod_phase,omitempty"`
}

// Dispatcher runs build Jobs in one tenant-env's namespace with the
// worker's credentials, at most MaxConcurrent at once (the others wait in
// a queue, in order, and are told their place). Safe for concurrent use.
type Dispatcher struct {
	Kube      kubernetes.Interface
	Namespace string
	// MaxConcurrent builds at once; default 2 (each is a JVM of gigabytes
	// on the build pool; the namespace's ResourceQuota bounds Jobs too).
	MaxConcurrent int
	// PendingTimeout ends a build whose pod is not running this long after
	// its Job was created (unschedulable, image not pullable): its Job is
	// deleted and the outcome says why. Default 5 minutes.
	PendingTimeout time.Duration
	Logger         *slog.Logger

	once  sync.Once
	slots queue // MaxConcurrent slots, set by init
}

func (d *Dispatcher) init() {
	d.once.Do(func() {
		if d.MaxConcurrent <= 0 {
			d.MaxConcurrent = 2
		}
		if d.PendingTimeout <= 0 {
			d.PendingTimeout = 5 * time.Minute
		}
		if d.Logger == nil {
			d.Logger = slog.Default()
		}
		d.slots.max = d.MaxConcurrent
	})
}

// Run runs job to its end and returns how it ended. It creates the Job or,
// when it exists (the same build asked again, or a worker restarted while
// it ran), follows the existing one: a build never runs twice. It follows
// the Job with a watch that survives dropped connections and expired
// resource versions (an informer's relist). When ctx ends first (the turn
// interrupted, the conversation deleted) the Job is deleted with its pod
// (foreground propagation) and the outcome is Cancelled. Errors are the
// API's, when the Job could be neither created nor read.
func (d *Dispatcher) Run(ctx context.Context, job *batchv1.Job, progress func(Progress)) (Outcome, error) {
	return d.run(ctx, nil, job, progress)
}

// run is Run that returns PhaseDetached, leaving the Job as it is, once
// detach is closed (nil: never).
func (d *Dispatcher) run(ctx context.Context, detach <-chan struct{}, job *batchv1.Job, progress func(Progress)) (Outcome, error) {
	d.init()
	if progress == nil {
		progress = func(Progress) {}
	}
	out := Outcome{Job: job.Name}
	detached := func() (Outcome, error) {
		out.Phase, out.Reason, out.Message = PhaseDetached, "Detached", "the worker stopped following the build"
		return out, nil
	}
	acquireCtx, stopAcquire := context.WithCancel(ctx)
	defer stopAcquire()
	if detach != nil {
		go func() {
			select {
			case <-detach:
				stopAcquire()
			case <-acquireCtx.Done():
			}
		}()
	}
	if err := d.slots.acquire(acquireCtx, progress); err != nil {
		if ctx.Err() == nil {
			return detached()
		}
		out.Phase, out.Reason, out.Message = PhaseCancelled, "Cancelled", "cancelled while queued"
		return out, nil
	}
	defer d.slots.release()
	jobs := d.Kube.BatchV1().Jobs(d.Namespace)
	created, err := jobs.Create(ctx, job, metav1.CreateOptions{})
	adopted := false
	switch {
	case apierrors.IsAlreadyExists(err):
		if created, err = jobs.Get(ctx, job.Name, metav1.GetOptions{}); err != nil {
			return out, fmt.Errorf("read build Job %s: %w", job.Name, err)
		}
		if created.Labels[LabelBuild] != job.Labels[LabelBuild] || created.Labels[LabelConversation] != job.Labels[LabelConversation] {
			return out, fmt.Errorf("build Job %s exists for another build", job.Name)
		}
		adopted = true
	case err != nil:
		if ctx.Err() != nil {
			out.Phase, out.Reason, out.Message = PhaseCancelled, "Cancelled", "cancelled before the Job was made"
			return out, nil
		}
		return out, fmt.Errorf("create build Job %s: %w", job.Name, err)
	}
	progress(Progress{Started: true, Adopted: adopted})

	// Follow the Job until it finishes; meanwhile look at its pod each
	// second for the Pending timeout.
	type result struct {
		job *batchv1.Job
		err error
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	finished := make(chan result, 1)
	go func() {
		sel := fields.OneTermEqualSelector("metadata.name", job.Name).String()
		lw := &cache.ListWatch{
			ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
				o.FieldSelector = sel
				return jobs.List(watchCtx, o)
			},
			WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
				o.FieldSelector = sel
				return jobs.Watch(watchCtx, o)
			},
		}
		ev, err := watchtools.UntilWithSync(watchCtx, lw, &batchv1.Job{}, nil, func(e watch.Event) (bool, error) {
			if e.Type == watch.Deleted {
				return false, errors.New("the build Job was deleted")
			}
			j, ok := e.Object.(*batchv1.Job)
			return ok && (condition(j, batchv1.JobComplete) || condition(j, batchv1.JobFailed)), nil
		})
		r := result{err: err}
		if err == nil {
			r.job = ev.Object.(*batchv1.Job)
		}
		finished <- r
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastPhase := ""
	for {
		select {
		case r := <-finished:
			if r.err != nil {
				if ctx.Err() != nil {
					return d.cancel(job.Name, out, "cancelled")
				}
				out.Phase, out.Reason, out.Message = PhaseFailed, "Lost", r.err.Error()
				return out, nil
			}
			if condition(r.job, batchv1.JobComplete) {
				out.Phase = PhaseSucceeded
				return out, nil
			}
			out.Phase = PhaseFailed
			for _, c := range r.job.Status.Conditions {
				if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
					out.Reason, out.Message = c.Reason, c.Message
				}
			}
			return out, nil
		case <-ctx.Done():
			return d.cancel(job.Name, out, "cancelled")
		case <-detach:
			return detached()
		case <-tick.C:
			pod, err := d.buildPod(ctx, job.Name)
			if err != nil || pod == nil {
				continue
			}
			if string(pod.Status.Phase) != lastPhase {
				lastPhase = string(pod.Status.Phase)
				progress(Progress{PodPhase: lastPhase})
			}
			if pod.Status.Phase == corev1.PodPending && time.Since(created.CreationTimestamp.Time) > d.PendingTimeout {
				reason, msg := pendingReason(pod)
				out, err := d.cancel(job.Name, out, "")
				out.Phase, out.Reason = PhaseFailed, reason
				out.Message = fmt.Sprintf("the build's pod was still pending after %v: %s", d.PendingTimeout, msg)
				return out, err
			}
		}
	}
}

// buildPod returns the Job's pod (the newest), nil when none exists yet.
func (d *Dispatcher) buildPod(ctx context.Context, job string) (*corev1.Pod, error) {
	pods, err := d.Kube.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil || len(pods.Items) == 0 {
		return nil, err
	}
	newest := &pods.Items[0]
	for i := range pods.Items {
		if pods.Items[i].CreationTimestamp.After(newest.CreationTimestamp.Time) {
			newest = &pods.Items[i]
		}
	}
	return newest, nil
}

// pendingReason says why a pod is Pending: the scheduler's reason, or its
// container's waiting reason (ImagePullBackOff, ErrImagePull, …).
func pendingReason(p *corev1.Pod) (string, string) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return nonEmpty(c.Reason, "Unschedulable"), c.Message
		}
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return w.Reason, w.Message
		}
	}
	return "PendingTimeout", "no reason reported"
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// cancel deletes the Job with its pod and waits (at most a minute) until
// the Job is gone.
func (d *Dispatcher) cancel(name string, out Outcome, msg string) (Outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out.Phase, out.Reason, out.Message = PhaseCancelled, "Cancelled", msg
	jobs := d.Kube.BatchV1().Jobs(d.Namespace)
	err := jobs.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return out, fmt.Errorf("delete build Job %s: %w", name, err)
	}
	for {
		if _, err := jobs.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			d.Logger.Warn("build Job still being deleted", "namespace", d.Namespace, "job", name)
			return out, nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func condition(j *batchv1.Job, t batchv1.JobConditionType) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// Existing is a build Job found in the namespace.
type Existing struct {
	Job          string
	Conversation string
	Build        string
	Kind         Kind
	Finished     bool
}

// Reconcile is the level-based pass after a worker (re)starts: it lists the
// build Jobs in the namespace, deletes (with their pods) those that
// expected does not claim (a deleted conversation, a build nobody waits
// for any more) and returns the others, which the caller follows again
// with Run (it adopts them: a finished one's result is still delivered).
func (d *Dispatcher) Reconcile(ctx context.Context, expected func(conversation, build string) bool) ([]Existing, error) {
	d.init()
	jobs, err := d.Kube.BatchV1().Jobs(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelComponent + "=" + ComponentBuild})
	if err != nil {
		return nil, fmt.Errorf("list build Jobs: %w", err)
	}
	var keep []Existing
	var errs []error
	for _, j := range jobs.Items {
		e := Existing{Job: j.Name, Conversation: j.Labels[LabelConversation], Build: j.Labels[LabelBuild], Kind: Kind(j.Labels[LabelKind]),
			Finished: condition(&j, batchv1.JobComplete) || condition(&j, batchv1.JobFailed)}
		if j.DeletionTimestamp == nil && expected(e.Conversation, e.Build) {
			keep = append(keep, e)
			continue
		}
		if j.DeletionTimestamp != nil {
			continue
		}
		err := d.Kube.BatchV1().Jobs(d.Namespace).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete orphaned build Job %s: %w", j.Name, err))
			continue
		}
		d.Logger.Info("orphaned build Job deleted", "namespace", d.Namespace, "job", j.Name, "conversation", e.Conversation, "build", e.Build)
	}
	return keep, errors.Join(errs...)
}
