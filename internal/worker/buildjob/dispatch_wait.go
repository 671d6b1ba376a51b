package buildjob

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// What a build waits for before its Job runs (Dispatcher.run): its
// conversation's turn, a Job create the quota refuses, an earlier Job of
// the same name that is being deleted.

// DeletionWait bounds how long a build waits for an earlier Job of the
// same name (an earlier run of the build, whose outcome is not this
// run's) to be deleted before it makes its own: foreground deletion waits
// for the pod's grace period (30 s by default). Past it, Run returns an
// error naming the Job and its finalizers.
const DeletionWait = 2 * time.Minute

// createTimeout bounds a Job create. The create is not cut short when the
// build is cancelled: its answer is awaited, so that the Job it made, if
// any, is known and deleted.
const createTimeout = 30 * time.Second

// errOtherBuild: the Job of the build's name belongs to another build.
var errOtherBuild = errors.New("exists for another build")

// conversationTurn waits until no other build of conv runs: first one of
// this Dispatcher's, then a build Job of conv in the namespace (one left
// running by a worker before it restarted). It says Queued (place 1)
// once while it waits. It returns ctx's error when ctx ends first, the
// API's when the Jobs cannot be listed; otherwise the caller holds conv's
// turn until conversationDone. A Job without a conversation ("") waits
// for nothing.
func (d *Dispatcher) conversationTurn(ctx context.Context, conv, self string, progress func(Progress)) error {
	if conv == "" {
		return nil
	}
	reported := false
	waiting := func() {
		if !reported {
			reported = true
			progress(Progress{Queued: 1})
		}
	}
	for {
		d.convMu.Lock()
		busy, ok := d.convs[conv]
		if !ok {
			d.convs[conv] = make(chan struct{})
			d.convMu.Unlock()
			break
		}
		d.convMu.Unlock()
		waiting()
		select {
		case <-busy:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := d.waitConversationJobs(ctx, conv, self, waiting); err != nil {
		d.conversationDone(conv)
		return err
	}
	return nil
}

// conversationDone ends the turn conversationTurn gave conv.
func (d *Dispatcher) conversationDone(conv string) {
	if conv == "" {
		return
	}
	d.convMu.Lock()
	defer d.convMu.Unlock()
	close(d.convs[conv])
	delete(d.convs, conv)
}

// waitConversationJobs waits until every build Job of conv in the
// namespace but self has finished or is gone (one being deleted runs
// until it is gone), calling waiting first if one has not. Errors are
// ctx's, or the API's when the Jobs cannot be listed.
func (d *Dispatcher) waitConversationJobs(ctx context.Context, conv, self string, waiting func()) error {
	sel := labels.Set{LabelComponent: ComponentBuild, LabelConversation: conv}.String()
	running := map[string]bool{} // the unfinished Jobs by name
	seen := func(j *batchv1.Job, gone bool) {
		if gone || j.Name == self || jobFinished(j) {
			delete(running, j.Name)
		} else {
			running[j.Name] = true
		}
	}
	// A list first: most builds have nothing to wait for, and an API that
	// refuses the list is an error, not a wait.
	list, err := d.Kube.BatchV1().Jobs(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("list build Jobs of conversation %s: %w", conv, err)
	}
	for i := range list.Items {
		seen(&list.Items[i], false)
	}
	if len(running) == 0 {
		return nil
	}
	waiting()
	d.Logger.Info("build waits for its conversation's running build Job", "namespace", d.Namespace, "conversation", conv, "job", self, "running", slices.Sorted(maps.Keys(running)))
	clear(running)
	_, err = watchtools.UntilWithSync(ctx, d.listWatch("", sel), &batchv1.Job{},
		func(store cache.Store) (bool, error) {
			for _, o := range store.List() {
				if j, ok := o.(*batchv1.Job); ok {
					seen(j, false)
				}
			}
			return len(running) == 0, nil
		},
		func(e watch.Event) (bool, error) {
			if j, ok := e.Object.(*batchv1.Job); ok {
				seen(j, e.Type == watch.Deleted)
			}
			return len(running) == 0, nil
		})
	return err
}

// create makes job and returns it, or the Job of its name made already
// (adopted). ctx is the build's: the create itself is not cut short when
// it ends (see createTimeout). Until the Job is made it waits, and gives
// up when waitCtx ends: while the namespace's quota refuses the Job (saying
// Queued, place 1, once), trying again with a backoff of 0.5 s doubling
// up to 5 s; and while an earlier Job of the same name is being deleted
// (at most DeletionWait). Errors are the API's, waitCtx's, errOtherBuild.
func (d *Dispatcher) create(ctx, waitCtx context.Context, job *batchv1.Job, progress func(Progress)) (created *batchv1.Job, adopted bool, err error) {
	jobs := d.Kube.BatchV1().Jobs(d.Namespace)
	backoff := quotaBackoff
	queued := false
	for {
		if err := waitCtx.Err(); err != nil {
			return nil, false, err
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
		made, err := jobs.Create(cctx, job, metav1.CreateOptions{})
		cancel()
		switch {
		case err == nil:
			return made, false, nil
		case apierrors.IsAlreadyExists(err):
			found, err := jobs.Get(waitCtx, job.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				continue // gone since
			case err != nil:
				return nil, false, fmt.Errorf("read build Job %s: %w", job.Name, err)
			case found.Labels[LabelBuild] != job.Labels[LabelBuild] || found.Labels[LabelConversation] != job.Labels[LabelConversation]:
				return nil, false, fmt.Errorf("build Job %s %w", job.Name, errOtherBuild)
			case found.DeletionTimestamp == nil:
				return found, true, nil
			}
			// An earlier run's Job, being deleted: its outcome is not this
			// run's.
			d.Logger.Info("build waits until an earlier Job of its name is deleted", "namespace", d.Namespace, "job", job.Name, "finalizers", found.Finalizers)
			gctx, cancel := context.WithTimeout(waitCtx, DeletionWait)
			err = d.waitGone(gctx, job.Name, found.UID)
			cancel()
			if err != nil {
				if waitCtx.Err() != nil {
					return nil, false, waitCtx.Err()
				}
				return nil, false, fmt.Errorf("build Job %s of an earlier run is still being deleted after %v (finalizers %q): %w", job.Name, DeletionWait, found.Finalizers, err)
			}
		case quotaRefused(err):
			if !queued {
				queued = true
				progress(Progress{Queued: 1})
				d.Logger.Info("build waits: the namespace's quota refuses its Job", "namespace", d.Namespace, "job", job.Name, "err", err)
			}
			t := time.NewTimer(backoff.Step())
			select {
			case <-waitCtx.Done():
				t.Stop()
				return nil, false, waitCtx.Err()
			case <-t.C:
			}
		default:
			return nil, false, fmt.Errorf("create build Job %s: %w", job.Name, err)
		}
	}
}

// quotaBackoff spaces the creates of a Job the quota refuses.
var quotaBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 10, Cap: 5 * time.Second}

// quotaRefused says whether err is the namespace's ResourceQuota refusing
// a create: the quota admission plugin answers 403 Forbidden, "exceeded
// quota: …" (or "status unknown for quota: …" until the quota controller
// has counted a new quota), with no status cause or reason of its own to
// tell it by; an admission policy's refusal is a 403 as well.
func quotaRefused(err error) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "exceeded quota") || strings.Contains(msg, "status unknown for quota")
}

// waitGone waits until the Job name is gone: deleted, or replaced by one
// of another uid (when uid is not empty). It returns ctx's error when ctx
// ends first.
func (d *Dispatcher) waitGone(ctx context.Context, name string, uid types.UID) error {
	ours := func(j *batchv1.Job) bool { return uid == "" || j.UID == uid }
	_, err := watchtools.UntilWithSync(ctx, d.listWatch(fields.OneTermEqualSelector("metadata.name", name).String(), ""), &batchv1.Job{},
		func(store cache.Store) (bool, error) {
			for _, o := range store.List() {
				if j, ok := o.(*batchv1.Job); ok && ours(j) {
					return false, nil
				}
			}
			return true, nil
		},
		func(e watch.Event) (bool, error) {
			j, ok := e.Object.(*batchv1.Job)
			return ok && (e.Type == watch.Deleted || !ours(j)), nil
		})
	return err
}

// listWatch lists and watches the namespace's Jobs matching the field and
// label selectors (either may be empty).
func (d *Dispatcher) listWatch(fieldSel, labelSel string) cache.ListerWatcher {
	jobs := d.Kube.BatchV1().Jobs(d.Namespace)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector, o.LabelSelector = fieldSel, labelSel
			return jobs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector, o.LabelSelector = fieldSel, labelSel
			return jobs.Watch(ctx, o)
		},
	}
}

// noPodReason says why the Job controller made no pod for j, from j's
// newest Warning event: FailedCreate with the API server's refusal (the
// namespace's quota, an admission policy). NoPod when there is none, or
// the worker may not read events (its Role needs events: list).
func (d *Dispatcher) noPodReason(ctx context.Context, j *batchv1.Job) (reason, msg string) {
	evs, err := d.Kube.CoreV1().Events(d.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(j.UID)).String()})
	if err != nil {
		return "NoPod", fmt.Sprintf("the Job's events, which say why, could not be read (%v)", err)
	}
	var newest *corev1.Event
	for i := range evs.Items {
		e := &evs.Items[i]
		if e.Type == corev1.EventTypeWarning && (newest == nil || eventTime(e).After(eventTime(newest))) {
			newest = e
		}
	}
	if newest == nil {
		return "NoPod", "the Job controller reported no reason"
	}
	return nonEmpty(newest.Reason, "NoPod"), newest.Message
}

// eventTime is when e last happened.
func eventTime(e *corev1.Event) time.Time {
	t := e.CreationTimestamp.Time
	for _, u := range []time.Time{e.FirstTimestamp.Time, e.LastTimestamp.Time, e.EventTime.Time} {
		if u.After(t) {
			t = u
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	return t
}
