package buildjob_test

// Faults of the dispatcher that other Kubernetes build runners hit, each
// replayed against the test cluster (issue 27): a Job that can make no
// pod, finished Jobs holding the namespace's Job quota, a cancel racing
// the Job's create, a dying Job of the same build adopted, and two builds
// of one working tree running at once.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/buildmcp"
	"github.com/talkide/talkide/internal/worker/mcphost"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// convJob is the Gradle Job of build id of conversation conv, its Job and
// pod labelled extra (kubetest.HoldLabel, ExitLabel).
func convJob(t *testing.T, tenant, conv, id string, extra map[string]string) *batchv1.Job {
	t.Helper()
	r := request(tenant, "dev")
	r.Conversation, r.ID = conv, id
	g := buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image, Labels: extra}}
	j, err := g.Job(buildjob.GradleRequest{Request: r, Tasks: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// setQuota gives ns a ResourceQuota of hard and waits until the quota
// controller has counted what it holds (before that the quota refuses
// every create it covers as "status unknown").
func setQuota(t *testing.T, admin kubernetes.Interface, ns string, hard corev1.ResourceList) {
	t.Helper()
	ctx := context.Background()
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "test-quota"}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}
	if _, err := admin.CoreV1().ResourceQuotas(ns).Create(ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		q, err := admin.CoreV1().ResourceQuotas(ns).Get(ctx, "test-quota", metav1.GetOptions{})
		if err == nil && len(q.Status.Hard) == len(hard) && len(q.Status.Used) == len(hard) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quota's status was never computed: %v %v", q, err)
		}
	}
}

// buildJobs are the build Jobs in ns matching the label set sel.
func buildJobs(t *testing.T, kube kubernetes.Interface, ns string, sel map[string]string) []batchv1.Job {
	t.Helper()
	l, err := kube.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{LabelSelector: labels.Set(sel).String()})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// waitNoJobs waits (at most within) until ns has no build Job matching sel,
// then checks that none appears in the next second (a create that landed
// late).
func waitNoJobs(t *testing.T, kube kubernetes.Interface, ns string, sel map[string]string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); len(buildJobs(t, kube, ns, sel)) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			j := buildJobs(t, kube, ns, sel)[0]
			t.Fatalf("build Job %s (%v) still there after %v; want none (deleting since %v)", j.Name, sel, within, j.DeletionTimestamp)
		}
	}
	time.Sleep(time.Second)
	if left := buildJobs(t, kube, ns, sel); len(left) > 0 {
		t.Fatalf("build Job %s (%v) appeared after the build ended", left[0].Name, sel)
	}
}

// release lets the held pod of Job name end (successfully): it removes
// the pod's kubetest.HoldLabel.
func release(t *testing.T, admin kubernetes.Interface, ns, name string) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
		if err == nil && len(pods.Items) == 1 && pods.Items[0].Status.Phase == corev1.PodRunning {
			if _, err := admin.CoreV1().Pods(ns).Patch(ctx, pods.Items[0].Name, types.JSONPatchType,
				[]byte(`[{"op":"remove","path":"/metadata/labels/`+kubetest.HoldLabel+`"}]`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod of %s never ran: %v %v", name, pods, err)
		}
	}
}

// A build Job whose pod the Job controller cannot make (the namespace's
// quota refuses it) ends at its Pending timeout, counted from the Job's
// creation with no pod at all, and says why: the Job's FailedCreate event
// (the worker's Role may list events), else that it could not read them.
// Its Job is deleted. (It used to wait for the Job's 30-minute deadline.)
func TestPendingTimeoutWithoutAPod(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	cluster := kubetest.Shared(t)
	admin := cluster.Client()
	var noEvents []rbacv1.PolicyRule
	for _, r := range provision.WorkerRules() {
		if !slices.Contains(r.Resources, "events") {
			noEvents = append(noEvents, r)
		}
	}
	blind, err := kubernetes.NewForConfig(cluster.ServiceAccountConfig(t, ns, "no-events", noEvents))
	if err != nil {
		t.Fatal(err)
	}
	setQuota(t, admin, ns, corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")})
	const timeout = 3 * time.Second
	for i, c := range []struct {
		name               string
		kube               kubernetes.Interface
		reason, wantInMsgs string
	}{
		{"with the worker's rights", worker, "FailedCreate", "exceeded quota"},
		{"without rights to events", blind, "NoPod", "could not be read"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &buildjob.Dispatcher{Kube: c.kube, Namespace: ns, PendingTimeout: timeout}
			j := convJob(t, tenant, fmt.Sprintf("c_nopod_%d", i), "toolu_nopod", nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			out, err := d.Run(ctx, j, nil)
			took := time.Since(start)
			if err != nil || out.Phase != buildjob.PhaseFailed || out.Reason != c.reason || !strings.Contains(out.Message, c.wantInMsgs) ||
				!strings.Contains(out.Message, "no pod") {
				t.Fatalf("outcome %+v %v after %v; want failed %s, saying no pod was made and %q", out, err, took, c.reason, c.wantInMsgs)
			}
			if took > timeout+10*time.Second {
				t.Errorf("the build ended %v after it started; want soon after its Pending timeout, %v", took, timeout)
			}
			if _, err := worker.BatchV1().Jobs(ns).Get(context.Background(), j.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the Job of a build that made no pod: %v; want it deleted", err)
			}
		})
	}
}

// A burst of builds beyond the namespace's Job quota (count/jobs.batch)
// queues instead of failing with "exceeded quota": with a quota of one
// Job and three builds asked for at once (of three conversations, through
// the agent's build tool, MaxConcurrent 3), all three succeed one after
// another, because each finished Job is deleted as soon as its result is
// delivered and a create the quota refuses waits and is tried again. No
// build Job is left once the results are in.
func TestBurstBeyondTheJobQuotaQueues(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	admin := kubetest.Shared(t).Client()
	setQuota(t, admin, ns, corev1.ResourceList{"count/jobs.batch": resource.MustParse("1")})
	store, err := sessionstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns, MaxConcurrent: 3}
	g := &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}
	if err := g.Validate(); err != nil { // as the worker does before its builds: it applies the defaults
		t.Fatal(err)
	}
	srv := buildmcp.New(buildmcp.Config{Runner: &buildjob.KubeRunner{Dispatcher: d, Gradle: g, WorkspaceRoot: t.TempDir(), Offline: true},
		RunnerName: buildjob.RunnerKubernetes, Tenant: tenant, Env: "dev", Records: store})
	var mu sync.Mutex
	queued := map[string]bool{}
	answers := make(chan string, 3)
	for i := range 3 {
		conv := fmt.Sprintf("c_burst_%d", i)
		h, err := srv.Open(buildmcp.Conversation{ID: conv, UID: 20001, Emit: func(typ contract.EventType, payload any) {
			if p, ok := payload.(contract.BuildProgress); ok && p.State == contract.BuildQueued {
				mu.Lock()
				queued[conv] = true
				mu.Unlock()
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		go func() { answers <- conv + ": " + runBuildTool(t, h, "toolu_burst") }()
	}
	for range 3 {
		select {
		case a := <-answers:
			if !strings.Contains(a, "BUILD SUCCEEDED") {
				t.Errorf("%s; want every build of the burst to succeed", a)
			}
		case <-time.After(3 * time.Minute):
			t.Fatal("the burst's builds did not all end")
		}
	}
	mu.Lock()
	if len(queued) < 2 {
		t.Errorf("builds told they queue: %v; want the two beyond the quota", queued)
	}
	mu.Unlock()
	waitNoJobs(t, worker, ns, map[string]string{buildjob.LabelComponent: buildjob.ComponentBuild}, 10*time.Second)
	if recs, _, _ := store.ListBuilds(); len(recs) != 0 {
		t.Errorf("records after delivery: %+v", recs)
	}
}

// runBuildTool makes one run_build tool call on h as Claude Code does and
// returns the answer.
func runBuildTool(t *testing.T, h *mcphost.Handler, toolUseID string) string {
	var last json.RawMessage
	for _, m := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"claude-code","version":"2.1.332"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_build","arguments":{},"_meta":{"claudecode/toolUseId":"` + toolUseID + `"}}}`,
	} {
		resp, err := h.HandleMCP(context.Background(), []byte(m))
		if err != nil {
			t.Error(err)
			return err.Error()
		}
		last = resp
	}
	var out struct {
		Result struct {
			Content []struct{ Text string } `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(last, &out); err != nil || len(out.Result.Content) == 0 {
		return string(last)
	}
	return out.Result.Content[0].Text
}

// createHook is a round tripper that does what its hook says with the
// requests that create Jobs (and passes every other request on).
type createHook struct {
	next http.RoundTripper
	mu   sync.Mutex
	hook func(next http.RoundTripper, req *http.Request) (*http.Response, error) // guarded by mu; nil: pass on
}

func (c *createHook) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	hook := c.hook
	if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/jobs") {
		c.hook = nil // once
	} else {
		hook = nil
	}
	c.mu.Unlock()
	if hook == nil {
		return c.next.RoundTrip(req)
	}
	return hook(c.next, req)
}

func (c *createHook) set(h func(next http.RoundTripper, req *http.Request) (*http.Response, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = h
}

// A cancel that races the Job's create (the turn interrupted just as the
// build starts) leaves no Job of that build behind, wherever it falls:
// before the create is sent, while it is in flight (after a few
// milliseconds, or with the answer lost to the cancel though the API
// server made the Job), or as the answer arrives. (A create the client
// gave up on used to be taken as no Job made, and its Job stayed Pending.)
func TestCancelRacingTheCreateLeavesNoJob(t *testing.T) {
	_, tenant, ns := workerNamespace(t)
	c := kubetest.Shared(t)
	token, err := c.Token(context.Background(), ns, provision.WorkerName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.TokenConfig(token)
	hooked := &createHook{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { hooked.next = rt; return hooked })
	worker, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns, PendingTimeout: 10 * time.Minute}
	type point struct {
		name string
		hook func(cancel context.CancelFunc) func(next http.RoundTripper, req *http.Request) (*http.Response, error)
	}
	points := []point{
		{"before the create is sent", func(cancel context.CancelFunc) func(http.RoundTripper, *http.Request) (*http.Response, error) {
			return func(next http.RoundTripper, req *http.Request) (*http.Response, error) {
				cancel()
				return next.RoundTrip(req)
			}
		}},
		{"in flight, its answer lost", func(cancel context.CancelFunc) func(http.RoundTripper, *http.Request) (*http.Response, error) {
			return func(next http.RoundTripper, req *http.Request) (*http.Response, error) {
				// The API server makes the Job; the client, cancelled,
				// never reads the answer.
				resp, err := next.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
				return nil, context.Canceled
			}
		}},
		{"as the answer arrives", func(cancel context.CancelFunc) func(http.RoundTripper, *http.Request) (*http.Response, error) {
			return func(next http.RoundTripper, req *http.Request) (*http.Response, error) {
				resp, err := next.RoundTrip(req)
				cancel()
				return resp, err
			}
		}},
	}
	for _, ms := range []int{0, 1, 2, 3, 5, 8, 13, 21} {
		points = append(points, point{fmt.Sprintf("%d ms after the create is sent", ms), func(cancel context.CancelFunc) func(http.RoundTripper, *http.Request) (*http.Response, error) {
			return func(next http.RoundTripper, req *http.Request) (*http.Response, error) {
				time.AfterFunc(time.Duration(ms)*time.Millisecond, cancel)
				return next.RoundTrip(req)
			}
		}})
	}
	for i, p := range points {
		conv := fmt.Sprintf("c_race_%d", i)
		ctx, cancel := context.WithCancel(context.Background())
		hooked.set(p.hook(cancel))
		out, err := d.Run(ctx, convJob(t, tenant, conv, "toolu_race", map[string]string{kubetest.HoldLabel: "1"}), nil)
		cancel()
		if err != nil || out.Phase != buildjob.PhaseCancelled {
			t.Errorf("%s: outcome %+v %v; want cancelled", p.name, out, err)
		}
		t.Run(p.name, func(t *testing.T) {
			waitNoJobs(t, c.Client(), ns, map[string]string{buildjob.LabelConversation: conv}, 5*time.Second)
		})
	}
}

// An earlier Job of the same build that failed and is being deleted (a
// finalizer holds it) is not adopted: the build waits until it is gone,
// runs a Job of its own and succeeds. (Its failure used to be returned at
// once as the new build's.)
func TestDyingJobOfTheSameBuildIsNotAdopted(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	admin := kubetest.Shared(t).Client()
	ctx := context.Background()
	const finalizer = "talkide.dev/test-hold"
	old := convJob(t, tenant, "c_again", "toolu_again", map[string]string{kubetest.ExitLabel: "1"})
	old.Finalizers = []string{finalizer}
	made, err := admin.BatchV1().Jobs(ns).Create(ctx, old, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		j, err := admin.BatchV1().Jobs(ns).Get(ctx, old.Name, metav1.GetOptions{})
		if err == nil && done(j, batchv1.JobFailed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the earlier Job never failed: %v", err)
		}
	}
	if err := admin.BatchV1().Jobs(ns).Delete(ctx, old.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	if j, err := admin.BatchV1().Jobs(ns).Get(ctx, old.Name, metav1.GetOptions{}); err != nil || j.DeletionTimestamp == nil {
		t.Fatalf("the earlier Job: %v %v; want it being deleted", j, err)
	}
	const hold = 3 * time.Second
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(hold)
		if _, err := admin.BatchV1().Jobs(ns).Patch(ctx, old.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			t.Error(err)
		}
	}()
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns}
	adopted := false
	start := time.Now()
	out, err := d.Run(ctx, convJob(t, tenant, "c_again", "toolu_again", nil), func(p buildjob.Progress) { adopted = adopted || p.Adopted })
	took := time.Since(start)
	<-released
	if err != nil || out.Phase != buildjob.PhaseSucceeded || adopted {
		t.Fatalf("outcome %+v %v after %v, adopted %v; want a Job of its own, succeeded", out, err, took, adopted)
	}
	if took < hold {
		t.Errorf("the build ended %v after it started, before the earlier Job was gone (%v)", took, hold)
	}
	if j, err := worker.BatchV1().Jobs(ns).Get(ctx, old.Name, metav1.GetOptions{}); err != nil || j.UID == made.UID {
		t.Errorf("the build's Job: %v; want a new one (not uid %s)", err, made.UID)
	}
}

// Builds of one conversation (one working tree) never run as Jobs at
// once, whether the other Job is this dispatcher's or one left running
// from before a worker restart: a build waits, told it is queued and
// cancellable, until the other's Job has finished. Builds of another
// conversation run meanwhile. (Both used to run, and Gradle's lock on the
// tree's cache made the second time out.)
func TestBuildsOfOneConversationNeverOverlap(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	admin := kubetest.Shared(t).Client()
	ctx := context.Background()
	const conv = "c_one"
	// The Job an earlier worker started, still running.
	left := convJob(t, tenant, conv, "toolu_left", map[string]string{kubetest.HoldLabel: "1"})
	if _, err := worker.BatchV1().Jobs(ns).Create(ctx, left, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns, MaxConcurrent: 4}
	// alone checks, as a build of conv starts, that no other Job of conv
	// is unfinished.
	alone := func(name string) {
		for _, j := range buildJobs(t, worker, ns, map[string]string{buildjob.LabelConversation: conv}) {
			if j.Name != name && !finished(&j) {
				t.Errorf("build Job %s started while %s of the same conversation runs", name, j.Name)
			}
		}
	}
	type run struct {
		queued  chan struct{}
		started chan struct{}
		out     chan buildjob.Outcome
	}
	start := func(ctx context.Context, j *batchv1.Job) *run {
		r := &run{queued: make(chan struct{}), started: make(chan struct{}), out: make(chan buildjob.Outcome, 1)}
		var q, s sync.Once
		go func() {
			out, err := d.Run(ctx, j, func(p buildjob.Progress) {
				if p.Queued > 0 {
					q.Do(func() { close(r.queued) })
				}
				if p.Started {
					if j.Labels[buildjob.LabelConversation] == conv {
						alone(j.Name)
					}
					s.Do(func() { close(r.started) })
				}
			})
			if err != nil {
				t.Error(err)
			}
			r.out <- out
		}()
		return r
	}
	within := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("%s: not within a minute", what)
		}
	}
	a := start(ctx, convJob(t, tenant, conv, "toolu_a", nil))
	b := start(ctx, convJob(t, tenant, conv, "toolu_b", nil))
	cancelled, cancel := context.WithCancel(ctx)
	x := start(cancelled, convJob(t, tenant, conv, "toolu_x", nil))
	otherJob := convJob(t, tenant, "c_other", "toolu_other", map[string]string{kubetest.HoldLabel: "1"})
	other := start(ctx, otherJob)
	within(other.started, "a build of another conversation started")
	within(a.queued, "the first build waiting told it is queued")
	within(b.queued, "the second build waiting told it is queued")
	within(x.queued, "the third build waiting told it is queued")
	// Waiting is cancellable.
	cancel()
	select {
	case out := <-x.out:
		if out.Phase != buildjob.PhaseCancelled {
			t.Errorf("a build cancelled while it waits for its conversation: %+v", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a build cancelled while it waits for its conversation did not end")
	}
	time.Sleep(2 * time.Second)
	if n := len(buildJobs(t, worker, ns, map[string]string{buildjob.LabelConversation: conv})); n != 1 {
		t.Errorf("%d Jobs of the conversation while its earlier build runs; want that one only", n)
	}
	release(t, admin, ns, left.Name)
	for _, r := range []*run{a, b} {
		select {
		case out := <-r.out:
			if out.Phase != buildjob.PhaseSucceeded {
				t.Errorf("a build of the conversation: %+v", out)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("the conversation's builds did not run after its earlier build")
		}
	}
	release(t, admin, ns, otherJob.Name)
	select {
	case out := <-other.out:
		if out.Phase != buildjob.PhaseSucceeded {
			t.Errorf("the other conversation's build: %+v", out)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the other conversation's build did not end")
	}
}

// The conversation's next build Job is made only once the previous build
// has read what it left in the working tree: the next one starts by
// removing the reports (review of issue 27's serialization: the turn was
// given back when the Job finished, before its log drained and its
// results were read).
func TestNextBuildWaitsForTheResultsToBeRead(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	r := &buildjob.KubeRunner{Dispatcher: &buildjob.Dispatcher{Kube: worker, Namespace: ns, MaxConcurrent: 4},
		Gradle: &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}, WorkspaceRoot: t.TempDir(), Offline: true}
	var mu sync.Mutex
	var aReturned, bStarted time.Time
	var wg sync.WaitGroup
	for _, id := range []string{"toolu_a", "toolu_b"} {
		req := request(tenant, "dev")
		req.ID = id
		wg.Go(func() {
			if id == "toolu_b" {
				time.Sleep(300 * time.Millisecond) // a is first
			}
			_, err := r.Run(context.Background(), req, buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{
				Progress: func(p buildjob.Progress) {
					if p.Started && id == "toolu_b" {
						mu.Lock()
						bStarted = time.Now()
						mu.Unlock()
					}
				}})
			if err != nil {
				t.Error(err)
			}
			if id == "toolu_a" {
				mu.Lock()
				aReturned = time.Now()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if bStarted.IsZero() || aReturned.IsZero() || bStarted.Before(aReturned) {
		t.Fatalf("the second build's Job was made at %v, the first build returned (its results read) at %v: the second must wait",
			bStarted.Format(time.StampMilli), aReturned.Format(time.StampMilli))
	}
}

// A build whose Job runs already (a worker restart, a repeated request)
// and is cancelled while it waits for a slot ends its Job (review of
// issue 27: it was told Cancelled and its Job ran on to its deadline).
func TestCancelWhileQueuedEndsARunningJob(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	ctx := context.Background()
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns, MaxConcurrent: 1}
	// The one slot, taken by a held build of another conversation.
	busyCtx, stopBusy := context.WithCancel(ctx)
	defer stopBusy()
	busy := make(chan struct{})
	go func() {
		d.Run(busyCtx, convJob(t, tenant, "c_busy", "toolu_busy", map[string]string{kubetest.HoldLabel: "1"}), func(p buildjob.Progress) {
			if p.Started {
				close(busy)
			}
		})
	}()
	<-busy
	running := convJob(t, tenant, "c_again", "toolu_again", map[string]string{kubetest.HoldLabel: "1"})
	if _, err := worker.BatchV1().Jobs(ns).Create(ctx, running, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	queued := make(chan struct{})
	done := make(chan buildjob.Outcome, 1)
	go func() {
		var once sync.Once
		out, _ := d.Run(cctx, running.DeepCopy(), func(p buildjob.Progress) {
			if p.Queued > 0 {
				once.Do(func() { close(queued) })
			}
		})
		done <- out
	}()
	select {
	case <-queued:
	case <-time.After(time.Minute):
		t.Fatal("the build never queued for the slot")
	}
	cancel()
	if out := <-done; out.Phase != buildjob.PhaseCancelled {
		t.Fatalf("outcome %+v, want cancelled", out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := worker.BatchV1().Jobs(ns).Get(ctx, running.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled build's running Job is still there: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
