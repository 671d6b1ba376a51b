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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
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
// Job's own failure reason (DeadlineExceeded, BackoffLimitExceeded, …);
// Unschedulable, ImagePullBackOff (or the pod's other waiting reason) when
// its pod stayed Pending past Dispatcher.PendingTimeout; the reason of the
// Job's newest Warning event (FailedCreate: the namespace's quota or an
// admission policy refused the pod) or NoPod when no pod was made by
// then; or Cancelled.
type Outcome struct {
	Job     string `json:"job"`
	Phase   string `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Progress is what a build reports while it waits or runs: Queued with
// its place (1: next; also while it waits for its conversation's other
// build or for the namespace's Job quota), then Started once its Job
// exists.
type Progress struct {
	Queued   int    `json:"queued,omitempty"`
	Started  bool   `json:"started,omitempty"`
	Adopted  bool   `json:"adopted,omitempty"` // the Job existed already (a restart, a repeated request)
	PodPhase string `json:"pod_phase,omitempty"`
}

// Dispatcher runs build Jobs in one tenant-env's namespace with the
// worker's credentials: at most MaxConcurrent at once (the others wait in
// a queue, in order, and are told their place) and at most one Job per
// conversation (its builds share a working tree, and Gradle's locks on
// it), whether the other Job is this Dispatcher's or one a worker left
// running before it restarted. A create that the namespace's ResourceQuota
// refuses (count/jobs.batch) waits as well, and is tried again. Safe for
// concurrent use.
type Dispatcher struct {
	Kube      kubernetes.Interface
	Namespace string
	// MaxConcurrent builds at once; default 2 (each is a JVM of gigabytes
	// on the build pool; the namespace's ResourceQuota bounds Jobs too,
	// and a build beyond it waits).
	MaxConcurrent int
	// PendingTimeout ends a build whose pod is not running this long after
	// its Job was created, whether a pod exists (unschedulable, image not
	// pullable) or none could be made (the namespace's quota refused it):
	// its Job is deleted and the outcome says why. Default 5 minutes.
	PendingTimeout time.Duration
	Logger         *slog.Logger

	once  sync.Once
	slots queue // MaxConcurrent slots, set by init

	convMu sync.Mutex
	// convs holds, for each conversation one of whose builds this
	// Dispatcher runs, a channel closed when that build ends; guarded by
	// convMu.
	convs map[string]chan struct{}
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
		d.convs = map[string]chan struct{}{}
	})
}

// Run runs job to its end and returns how it ended. job carries its
// build's labels (LabelConversation, LabelBuild), as the builders' Jobs do.
//
// When job's Job exists (the same build asked again, or a worker restarted
// while it ran) Run follows it: a build never runs twice. One that is
// being deleted (an earlier run's, with its outcome) is never adopted: Run
// waits until it is gone, at most DeletionWait, and makes a new one.
// Otherwise the build waits its turn first, told it is queued: until no
// other Job of its conversation runs, then for one of MaxConcurrent
// slots, then for as long as the namespace's quota refuses the Job.
//
// It follows the Job with a watch that survives dropped connections and
// expired resource versions (an informer's relist). A build with no pod
// running PendingTimeout after its Job was made fails, its Job deleted.
// When ctx ends first (the turn interrupted, the conversation deleted)
// the Job is deleted with its pod (foreground propagation), also one
// whose create was in flight (by its uid once the create's answer came,
// else by name), and the outcome is Cancelled. A Job that ran to its end
// stays, for its pod's exit code and log to be read; Delete it once the
// build's result is delivered. Errors are the API's, when the Job could be
// neither created nor read, or that an earlier Job of the build was still
// being deleted after DeletionWait.
func (d *Dispatcher) Run(ctx context.Context, job *batchv1.Job, progress func(Progress)) (Outcome, error) {
	out, done, err := d.run(ctx, nil, job, progress)
	done()
	return out, err
}

// run is Run that returns PhaseDetached, leaving the Job as it is, once
// detach is closed (nil: never). It returns holding its conversation's
// turn: the caller calls done once it has read what the build left in the
// working tree (its reports), so that the conversation's next build, which
// starts by removing them, cannot run before.
func (d *Dispatcher) run(ctx context.Context, detach <-chan struct{}, job *batchv1.Job, progress func(Progress)) (_ Outcome, done func(), _ error) {
	var release []func()
	done = func() {
		for _, f := range release {
			f()
		}
		release = nil
	}
	out, err := d.runHolding(ctx, detach, job, progress, &release)
	return out, done, err
}

// runHolding is run; what must be released after the caller read the
// results is appended to release.
func (d *Dispatcher) runHolding(ctx context.Context, detach <-chan struct{}, job *batchv1.Job, progress func(Progress), release *[]func()) (Outcome, error) {
	d.init()
	if progress == nil {
		progress = func(Progress) {}
	}
	out := Outcome{Job: job.Name}
	detached := func() (Outcome, error) {
		out.Phase, out.Reason, out.Message = PhaseDetached, "Detached", "the worker stopped following the build"
		return out, nil
	}
	// waitCtx ends with ctx or when detach is closed: what a build waits
	// for before its Job is made is given up either way.
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	if detach != nil {
		go func() {
			select {
			case <-detach:
				stopWaiting()
			case <-waitCtx.Done():
			}
		}()
	}
	stopped := func() (Outcome, error) {
		if ctx.Err() == nil {
			return detached()
		}
		out.Phase, out.Reason, out.Message = PhaseCancelled, "Cancelled", "cancelled while queued"
		return out, nil
	}
	jobs := d.Kube.BatchV1().Jobs(d.Namespace)
	// A build whose Job runs already is followed at once: it is the one
	// its conversation's other builds wait for.
	own, err := jobs.Get(waitCtx, job.Name, metav1.GetOptions{})
	running := err == nil && own.DeletionTimestamp == nil
	if !running {
		conv := job.Labels[LabelConversation]
		if err := d.conversationTurn(waitCtx, conv, job.Name, progress); err != nil {
			if waitCtx.Err() != nil {
				return stopped()
			}
			return out, err
		}
		*release = append(*release, func() { d.conversationDone(conv) })
	}
	if err := d.slots.acquire(waitCtx, progress); err != nil {
		if running && ctx.Err() != nil {
			// Its Job runs already (a restart, a repeated request): a
			// cancel ends it, as it would once followed.
			return d.cancel(job.Name, own.UID, out, "cancelled")
		}
		return stopped()
	}
	defer d.slots.release()
	created, adopted, err := d.create(ctx, waitCtx, job, progress)
	switch {
	case errors.Is(err, errOtherBuild):
		return out, err
	case ctx.Err() != nil:
		// Cancelled around the create: what it made goes, by its uid when
		// its answer came, else by name (a create given up on in flight
		// may have been made all the same).
		var uid types.UID
		msg := "cancelled before the Job was made"
		if created != nil {
			uid, msg = created.UID, "cancelled"
		}
		return d.cancel(job.Name, uid, out, msg)
	case err != nil && waitCtx.Err() != nil:
		return detached()
	case err != nil:
		return out, err
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
		lw := d.listWatch(fields.OneTermEqualSelector("metadata.name", job.Name).String(), "")
		ev, err := watchtools.UntilWithSync(watchCtx, lw, &batchv1.Job{}, nil, func(e watch.Event) (bool, error) {
			if e.Type == watch.Deleted {
				return false, errors.New("the build Job was deleted")
			}
			j, ok := e.Object.(*batchv1.Job)
			return ok && jobFinished(j), nil
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
					return d.cancel(job.Name, created.UID, out, "cancelled")
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
			return d.cancel(job.Name, created.UID, out, "cancelled")
		case <-detach:
			return detached()
		case <-tick.C:
			pod, err := d.buildPod(ctx, job.Name)
			if err != nil {
				continue
			}
			if pod != nil && string(pod.Status.Phase) != lastPhase {
				lastPhase = string(pod.Status.Phase)
				progress(Progress{PodPhase: lastPhase})
			}
			// Counted from the Job's creation, with a pod or none: a Job
			// whose pod the Job controller cannot make (the namespace's
			// quota refuses it) would otherwise wait for its deadline.
			if (pod != nil && pod.Status.Phase != corev1.PodPending) || time.Since(created.CreationTimestamp.Time) <= d.PendingTimeout {
				continue
			}
			if j, err := jobs.Get(ctx, job.Name, metav1.GetOptions{}); err == nil && j.UID == created.UID && jobFinished(j) {
				continue // the watch tells it
			}
			var reason, msg string
			if pod != nil {
				reason, msg = pendingReason(pod)
				msg = fmt.Sprintf("the build's pod was still pending after %v: %s", d.PendingTimeout, msg)
			} else {
				reason, msg = d.noPodReason(ctx, created)
				msg = fmt.Sprintf("no pod was made for the build's Job in %v: %s", d.PendingTimeout, msg)
			}
			out, err := d.cancel(job.Name, created.UID, out, "")
			out.Phase, out.Reason, out.Message = PhaseFailed, reason, msg
			return out, err
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

// cancel deletes the Job name (of uid, when not empty: a Job of that name
// made since is another build's) with its pod, and waits (at most a
// minute) until it is gone.
func (d *Dispatcher) cancel(name string, uid types.UID, out Outcome, msg string) (Outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out.Phase, out.Reason, out.Message = PhaseCancelled, "Cancelled", msg
	opts := metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}
	if uid != "" {
		opts.Preconditions = metav1.NewUIDPreconditions(string(uid))
	}
	err := d.Kube.BatchV1().Jobs(d.Namespace).Delete(ctx, name, opts)
	switch {
	case apierrors.IsNotFound(err), uid != "" && apierrors.IsConflict(err):
		return out, nil // gone, or replaced by another build's
	case err != nil:
		return out, fmt.Errorf("delete build Job %s: %w", name, err)
	}
	if err := d.waitGone(ctx, name, uid); err != nil {
		d.Logger.Warn("build Job still being deleted", "namespace", d.Namespace, "job", name, "err", err)
	}
	return out, nil
}

// Delete deletes the build Job name once its build's result is read and
// delivered (its pod's exit code and log, the reports it left): a
// finished Job counts against the namespace's Job quota
// (count/jobs.batch) until it is gone, and builds beyond the quota wait
// for it. Background propagation: the Job goes at once, the garbage
// collector deletes its pod after. Deleting it earlier loses the result
// of a build whose worker restarts before delivering it (the next worker
// follows the Job again to deliver it). A Job already gone is no error;
// errors are the API's.
func (d *Dispatcher) Delete(ctx context.Context, name string) error {
	err := d.Kube.BatchV1().Jobs(d.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete build Job %s: %w", name, err)
	}
	return nil
}

// jobFinished says whether j has run to its end, succeeded or failed.
func jobFinished(j *batchv1.Job) bool {
	return condition(j, batchv1.JobComplete) || condition(j, batchv1.JobFailed)
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
			Finished: jobFinished(&j)}
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
