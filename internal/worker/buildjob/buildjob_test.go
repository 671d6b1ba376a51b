package buildjob_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/buildmcp"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

const image = "registry.example/gradle@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func request(tenant, env string) buildjob.Request {
	return buildjob.Request{Tenant: tenant, Env: env, Conversation: "c_0123456789abcdef", ID: "toolu_01ABCdef", RunAsUser: 20001}
}

// A build's Job name is the same for the same build (a repeated create
// finds it) and different for any other, and always a valid name.
func TestJobName(t *testing.T) {
	a := buildjob.JobName(buildjob.KindGradle, "c1", "toolu_1")
	if a != buildjob.JobName(buildjob.KindGradle, "c1", "toolu_1") {
		t.Fatal("not deterministic")
	}
	long := strings.Repeat("x", 128)
	for _, other := range []string{buildjob.JobName(buildjob.KindGradle, "c1", "toolu_2"), buildjob.JobName(buildjob.KindGradle, "c2", "toolu_1"),
		buildjob.JobName(buildjob.KindKaniko, "c1", "toolu_1"), buildjob.JobName(buildjob.KindGradle, "c1t", "oolu_1")} {
		if other == a {
			t.Errorf("two builds share the name %s", a)
		}
	}
	if n := buildjob.JobName(buildjob.KindGradle, long, long); len(n) > 63 || !provision.ValidName(strings.ReplaceAll(n, "build-", "b")) {
		t.Errorf("name %q (%d characters)", n, len(n))
	}
}

// What a request or a configuration may not do is refused before any Job
// reaches the cluster, with the reason.
func TestRefusals(t *testing.T) {
	ok := buildjob.GradleRequest{Request: request("acme", "dev"), Tasks: []string{"test"}}
	for name, c := range map[string]struct {
		b    buildjob.GradleJobBuilder
		r    func(buildjob.GradleRequest) buildjob.GradleRequest
		want string
	}{
		"a tag, not a digest": {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: "gradle:8-jdk17"}}, nil, "pinned by digest"},
		"root":                {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}, func(r buildjob.GradleRequest) buildjob.GradleRequest { r.RunAsUser = 0; return r }, "never root"},
		"an option as a task": {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}, func(r buildjob.GradleRequest) buildjob.GradleRequest {
			r.Tasks = []string{"--init-script=/tmp/x"}
			return r
		}, "want a task name"},
		"an option in a filter": {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}, func(r buildjob.GradleRequest) buildjob.GradleRequest { r.Tests = "X --init-script y"; return r }, "test filter"},
		"no task":               {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}, func(r buildjob.GradleRequest) buildjob.GradleRequest { r.Tasks = nil; return r }, "no task"},
		"a conversation path":   {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}, func(r buildjob.GradleRequest) buildjob.GradleRequest { r.Conversation = "../c"; return r }, "conversation"},
		"a node by name":        {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image, NodeSelector: map[string]string{"kubernetes.io/hostname": "n1"}}}, nil, "by name"},
		"every taint":           {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}, nil, "toleration"},
		"an unhealthy node":     {buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image, Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/unreachable"}}}}, nil, "toleration"},
	} {
		r := ok
		if c.r != nil {
			r = c.r(r)
		}
		if _, err := c.b.Job(r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a refusal saying %q", name, err, c.want)
		}
	}
	k := buildjob.KanikoJobBuilder{Base: buildjob.Base{Image: image}}
	for _, bad := range []buildjob.KanikoRequest{
		{Request: request("acme", "dev"), Context: "../other"},
		{Request: request("acme", "dev"), Context: "/etc"},
		{Request: request("acme", "dev"), Context: ".", Dockerfile: "../../Dockerfile"},
		{Request: request("acme", "dev"), Context: ".", Destination: "reg.example/x --insecure"},
	} {
		if _, err := k.Job(bad); err == nil {
			t.Errorf("kaniko %+v: accepted", bad)
		}
	}
}

// Against the test cluster, with the worker's own credentials (its Role)
// and the admission policy on workers' Jobs in force: a Gradle Job and a
// Kaniko Job are admitted as built, the Gradle Job runs to completion, a
// second create of the same build finds the first, and the policy is
// shown to be in force by refusing a Job changed to use the node's
// network.
// workerNamespace makes a tenant-env namespace as the provisioner would
// for builds (its labels, the session claim, the Job policy in force) and
// returns a client acting as its worker (exactly the worker's Role).
func workerNamespace(t *testing.T) (worker kubernetes.Interface, tenant, ns string) {
	t.Helper()
	c := kubetest.Shared(t)
	ctx := context.Background()
	admin := c.Client()
	pol, bind := provision.JobPolicy()
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, bind, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(t.Name()))
	tenant = "bj" + hex.EncodeToString(sum[:4])
	ns = provision.Namespace(tenant, "dev")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{provision.LabelManagedBy: provision.ManagedBy}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: provision.PVCName},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	worker, err := kubernetes.NewForConfig(c.ServiceAccountConfig(t, ns, provision.WorkerName, provision.WorkerRules()))
	if err != nil {
		t.Fatal(err)
	}
	// The policy is in force before anything is created (admission
	// policies take a moment to load).
	waitPolicy(t, worker, ns)
	return worker, tenant, ns
}

func TestJobsRunWithTheWorkersRights(t *testing.T) {
	ctx := context.Background()
	worker, tenant, ns := workerNamespace(t)
	g := buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}}
	gj, err := g.Job(buildjob.GradleRequest{Request: request(tenant, "dev"), Tasks: []string{"test"}, Tests: "com.acme.FooTest", Offline: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := worker.BatchV1().Jobs(ns).Create(ctx, gj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the worker's Gradle Job: %v", err)
	}
	if _, err := worker.BatchV1().Jobs(ns).Create(ctx, gj, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("the same build created twice: %v; want AlreadyExists", err)
	}
	k := buildjob.KanikoJobBuilder{Base: buildjob.Base{Image: image}}
	r := request(tenant, "dev")
	r.ID = "toolu_kaniko"
	kj, err := k.Job(buildjob.KanikoRequest{Request: r, Context: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := worker.BatchV1().Jobs(ns).Create(ctx, kj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the worker's Kaniko Job: %v", err)
	}

	deadline := time.Now().Add(2 * time.Minute)
	for {
		j, err := worker.BatchV1().Jobs(ns).Get(ctx, gj.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if done(j, batchv1.JobComplete) {
			break
		}
		if done(j, batchv1.JobFailed) || time.Now().After(deadline) {
			t.Fatalf("Gradle Job: %+v", j.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	pods, err := worker.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: buildjob.LabelBuild + "=" + request(tenant, "dev").ID})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the Gradle Job's pods: %v %v", pods, err)
	}
	p := pods.Items[0]
	if m := p.Spec.Containers[0].VolumeMounts[0]; m.SubPath != "workspaces/"+request(tenant, "dev").Conversation || m.MountPath != buildjob.WorkspaceMount {
		t.Errorf("working tree mount %+v", m)
	}
	if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken || *p.Spec.SecurityContext.RunAsUser != 20001 {
		t.Errorf("pod: token %v, user %v", p.Spec.AutomountServiceAccountToken, p.Spec.SecurityContext.RunAsUser)
	}

	bad := gj.DeepCopy()
	bad.Name = "build-escape"
	bad.Spec.Template.Spec.HostNetwork = true
	if _, err := worker.BatchV1().Jobs(ns).Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Fatalf("a Job on the node's network: %v; want it refused by %s", err, provision.JobPolicyName)
	}
}

func done(j *batchv1.Job, cond batchv1.JobConditionType) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == cond && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// waitPolicy waits until the Job policy refuses a Job on the node's
// network in ns (a dry run).
func waitPolicy(t *testing.T, kube kubernetes.Interface, ns string) {
	t.Helper()
	probe := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe"}, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: image}}}}}}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := kube.BatchV1().Jobs(ns).Create(context.Background(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Job policy is not in force in %s: %v", ns, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func gradleJob(t *testing.T, tenant, id string, base buildjob.Base) *batchv1.Job {
	t.Helper()
	if base.Image == "" {
		base.Image = image
	}
	r := request(tenant, "dev")
	r.ID = id
	g := buildjob.GradleJobBuilder{Base: base}
	j, err := g.Job(buildjob.GradleRequest{Request: r, Tasks: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// The dispatcher runs a build to completion, and asked again for the same
// build (a repeated request, a restarted worker) follows the existing Job
// rather than starting another.
func TestDispatcherRunsToCompletionOnce(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns}
	j := gradleJob(t, tenant, "toolu_once", buildjob.Base{})
	var seen []buildjob.Progress
	out, err := d.Run(context.Background(), j, func(p buildjob.Progress) { seen = append(seen, p) })
	if err != nil || out.Phase != buildjob.PhaseSucceeded {
		t.Fatalf("outcome %+v %v", out, err)
	}
	if len(seen) == 0 || !seen[0].Started || seen[0].Adopted {
		t.Errorf("progress %+v; want started first, not adopted", seen)
	}
	seen = nil
	out, err = d.Run(context.Background(), j.DeepCopy(), func(p buildjob.Progress) { seen = append(seen, p) })
	if err != nil || out.Phase != buildjob.PhaseSucceeded || len(seen) == 0 || !seen[0].Adopted {
		t.Fatalf("the same build again: %+v %v, progress %+v; want the first Job followed", out, err, seen)
	}
	jobs, _ := worker.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{})
	if len(jobs.Items) != 1 {
		t.Errorf("%d Jobs for one build", len(jobs.Items))
	}
}

// A build whose pod cannot be scheduled ends within its Pending timeout
// with the scheduler's reason, and its Job is deleted.
func TestDispatcherPendingTimeout(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns, PendingTimeout: 2 * time.Second}
	j := gradleJob(t, tenant, "toolu_nowhere", buildjob.Base{NodeSelector: map[string]string{"talkide.dev/pool": "none"}})
	out, err := d.Run(context.Background(), j, nil)
	if err != nil || out.Phase != buildjob.PhaseFailed || out.Reason != "Unschedulable" || !strings.Contains(out.Message, "pending after 2s") {
		t.Fatalf("outcome %+v %v; want failed Unschedulable", out, err)
	}
	if _, err := worker.BatchV1().Jobs(ns).Get(context.Background(), j.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Job of a timed-out build: %v; want it deleted", err)
	}
}

// Builds beyond the limit queue and are told their place; cancelling a
// running build (the turn interrupted) deletes its Job, and the queued
// build then runs.
func TestDispatcherQueueAndCancel(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns, MaxConcurrent: 1, PendingTimeout: 10 * time.Minute}
	stuck := gradleJob(t, tenant, "toolu_stuck", buildjob.Base{NodeSelector: map[string]string{"talkide.dev/pool": "none"}})
	next := gradleJob(t, tenant, "toolu_next", buildjob.Base{})
	ctx, interrupt := context.WithCancel(context.Background())
	started := make(chan struct{}, 1)
	firstDone := make(chan buildjob.Outcome, 1)
	go func() {
		out, err := d.Run(ctx, stuck, func(p buildjob.Progress) {
			if p.Started {
				started <- struct{}{}
			}
		})
		if err != nil {
			t.Error(err)
		}
		firstDone <- out
	}()
	<-started
	queued := make(chan int, 4)
	secondDone := make(chan buildjob.Outcome, 1)
	go func() {
		out, err := d.Run(context.Background(), next, func(p buildjob.Progress) {
			if p.Queued > 0 {
				queued <- p.Queued
			}
		})
		if err != nil {
			t.Error(err)
		}
		secondDone <- out
	}()
	if place := <-queued; place != 1 {
		t.Fatalf("queued at place %d, want 1", place)
	}
	interrupt()
	if out := <-firstDone; out.Phase != buildjob.PhaseCancelled {
		t.Fatalf("the interrupted build: %+v", out)
	}
	if _, err := worker.BatchV1().Jobs(ns).Get(context.Background(), stuck.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the interrupted build's Job: %v; want it deleted", err)
	}
	if pods, _ := worker.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + stuck.Name}); len(pods.Items) != 0 {
		t.Errorf("the interrupted build's pod is still there: %s", pods.Items[0].Name)
	}
	select {
	case out := <-secondDone:
		if out.Phase != buildjob.PhaseSucceeded {
			t.Fatalf("the queued build: %+v", out)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the queued build never ran")
	}
}

// A finished build's log streams through the API server line by line
// (kwok plays the kubelet: every container logged kubetest.FakeLogLine),
// and the stream ends when the container has.
func TestFollowLogs(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns}
	j := gradleJob(t, tenant, "toolu_logs", buildjob.Base{})
	if out, err := d.Run(context.Background(), j, nil); err != nil || out.Phase != buildjob.PhaseSucceeded {
		t.Fatalf("outcome %+v %v", out, err)
	}
	pods, err := worker.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + j.Name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods %v %v", pods, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lines []string
	if err := d.FollowLogs(ctx, pods.Items[0].Name, "gradle", func(l string) { lines = append(lines, l) }); err != nil {
		t.Fatalf("follow: %v (lines %q)", err, lines)
	}
	if len(lines) != 1 || lines[0] != kubetest.FakeLogLine {
		t.Fatalf("lines %q; want the container's one line", lines)
	}
}

// After a worker restart: the build Jobs its SessionStore still expects
// are kept (and followed again, a finished one's result still delivered),
// the others (a deleted conversation's) are deleted.
func TestReconcileAfterRestart(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	d := &buildjob.Dispatcher{Kube: worker, Namespace: ns}
	kept := gradleJob(t, tenant, "toolu_kept", buildjob.Base{})
	orphan := gradleJob(t, tenant, "toolu_orphan", buildjob.Base{})
	for _, j := range []*batchv1.Job{kept, orphan} {
		if out, err := d.Run(context.Background(), j, nil); err != nil || out.Phase != buildjob.PhaseSucceeded {
			t.Fatalf("%s: %+v %v", j.Name, out, err)
		}
	}
	restarted := &buildjob.Dispatcher{Kube: worker, Namespace: ns}
	keep, err := restarted.Reconcile(context.Background(), func(conv, build string) bool { return build == "toolu_kept" })
	if err != nil || len(keep) != 1 || keep[0].Job != kept.Name || !keep[0].Finished {
		t.Fatalf("kept %+v %v", keep, err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		j, err := worker.BatchV1().Jobs(ns).Get(context.Background(), orphan.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan: %v %v; want it deleted", j.DeletionTimestamp, err)
		}
	}
	var adopted bool
	out, err := restarted.Run(context.Background(), kept.DeepCopy(), func(p buildjob.Progress) { adopted = adopted || p.Adopted })
	if err != nil || out.Phase != buildjob.PhaseSucceeded || !adopted {
		t.Fatalf("the kept build followed again: %+v %v adopted %v", out, err, adopted)
	}
}

// KubeRunner, with the worker's own credentials: the build's Job runs to
// completion, its log streams line by line into the hooks, its exit code
// is the container's, and its results are the JUnit report it left in the
// conversation's working tree on the session volume (the worker's view).
func TestKubeRunnerReportsAFinishedBuild(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	req := request(tenant, "dev")
	req.ID = "toolu_kuberunner"
	ws := t.TempDir()
	dir := filepath.Join(ws, req.Conversation, buildjob.ReportsDir, "test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile("testdata/TEST-com.acme.CalculatorTest.xml")
	if err != nil {
		t.Fatal(err)
	}
	// What the build wrote, as the agent's uid the Job runs as (kwok runs
	// no container, so the test plays the build's file).
	p := filepath.Join(dir, "TEST-com.acme.CalculatorTest.xml")
	if err := os.WriteFile(p, report, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, int(req.RunAsUser), int(req.RunAsUser)); err != nil {
		t.Fatal(err)
	}
	r := &buildjob.KubeRunner{Dispatcher: &buildjob.Dispatcher{Kube: worker, Namespace: ns}, Gradle: &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image}},
		WorkspaceRoot: ws, Offline: true}
	var mu sync.Mutex
	var lines []string
	var progress []buildjob.Progress
	rep, err := r.Run(context.Background(), req, buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{
		Progress: func(p buildjob.Progress) { mu.Lock(); progress = append(progress, p); mu.Unlock() },
		Line:     func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() },
	})
	if err != nil || rep.Outcome.Phase != buildjob.PhaseSucceeded || rep.Runner != buildjob.RunnerKubernetes || rep.ExitCode != 0 {
		t.Fatalf("report %+v %v", rep, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 1 || lines[0] != kubetest.FakeLogLine || len(rep.LogTail) != 1 {
		t.Errorf("log lines %q, tail %q; want the container's line", lines, rep.LogTail)
	}
	if len(progress) == 0 || !progress[0].Started {
		t.Errorf("progress %+v", progress)
	}
	f := rep.Results.Failed()
	if rep.Results.Tests != 4 || len(f) != 2 || f[0].Name != "divides" || f[0].Message != "expected:<4> but was:<5>" {
		t.Errorf("results %+v", rep.Results)
	}
}

// A build whose command fails ends failed with the container's exit code
// and the Job's reason, and its results are still read.
func TestKubeRunnerReportsAFailedBuild(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	req := request(tenant, "dev")
	req.ID = "toolu_fails"
	r := &buildjob.KubeRunner{Dispatcher: &buildjob.Dispatcher{Kube: worker, Namespace: ns},
		Gradle: &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image, Labels: map[string]string{kubetest.ExitLabel: "1"}}}, WorkspaceRoot: t.TempDir()}
	rep, err := r.Run(context.Background(), req, buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{})
	if err != nil || rep.Outcome.Phase != buildjob.PhaseFailed || rep.ExitCode != 1 || rep.Outcome.Reason == "" {
		t.Fatalf("report %+v %v; want failed with exit code 1 and the Job's reason", rep, err)
	}
}

// An interrupted turn deletes its running build: the Job and its pod are
// gone when Run returns cancelled.
func TestInterruptDeletesARunningJob(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	req := request(tenant, "dev")
	req.ID = "toolu_interrupted"
	r := &buildjob.KubeRunner{Dispatcher: &buildjob.Dispatcher{Kube: worker, Namespace: ns},
		Gradle: &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image, Labels: map[string]string{kubetest.HoldLabel: "1"}}}, WorkspaceRoot: t.TempDir()}
	ctx, interrupt := context.WithCancel(context.Background())
	running := make(chan struct{})
	var once sync.Once
	done := make(chan buildjob.Report, 1)
	go func() {
		rep, err := r.Run(ctx, req, buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{Progress: func(p buildjob.Progress) {
			if p.PodPhase == string(corev1.PodRunning) {
				once.Do(func() { close(running) })
			}
		}})
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	select {
	case <-running:
	case <-time.After(2 * time.Minute):
		t.Fatal("the build's pod never ran")
	}
	name := buildjob.JobName(buildjob.KindGradle, req.Conversation, req.ID)
	if j, err := worker.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{}); err != nil || finished(j) {
		t.Fatalf("the running build's Job: %v %v", j.Status, err)
	}
	interrupt()
	rep := <-done
	if rep.Outcome.Phase != buildjob.PhaseCancelled || rep.ExitCode != -1 {
		t.Fatalf("report %+v; want cancelled", rep)
	}
	if _, err := worker.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the interrupted build's Job: %v; want it deleted", err)
	}
	if pods, _ := worker.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name}); len(pods.Items) != 0 {
		t.Errorf("the interrupted build's pod is still there: %s", pods.Items[0].Name)
	}
}

func finished(j *batchv1.Job) bool { return done(j, batchv1.JobComplete) || done(j, batchv1.JobFailed) }

// A worker restart mid-Job still delivers the result, against the test
// cluster: the agent's build tool starts a build Job; the worker stops
// while the Job runs (it detaches: the Job goes on, its record stays);
// the Job finishes; the next worker's recovery pass adopts the finished
// Job and delivers its build_completed, marked recovered, with the
// results the build left in the working tree; and a Job nothing records
// any more is deleted.
func TestWorkerRestartMidJobDeliversTheResult(t *testing.T) {
	worker, tenant, ns := workerNamespace(t)
	admin := kubetest.Shared(t).Client()
	store, err := sessionstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	const conv, uid = "c_restart", 20001
	dir := filepath.Join(ws, conv, buildjob.ReportsDir, "test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	report, _ := os.ReadFile("testdata/TEST-com.acme.CalculatorTest.xml")
	p := filepath.Join(dir, "TEST-com.acme.CalculatorTest.xml")
	if err := os.WriteFile(p, report, 0o644); err != nil || os.Chown(p, uid, uid) != nil {
		t.Fatal(err)
	}
	newServer := func() (*buildmcp.Server, *buildjob.Dispatcher) {
		d := &buildjob.Dispatcher{Kube: worker, Namespace: ns}
		r := &buildjob.KubeRunner{Dispatcher: d, WorkspaceRoot: ws, Offline: true,
			Gradle: &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: image, Labels: map[string]string{kubetest.HoldLabel: "1"}}}}
		return buildmcp.New(buildmcp.Config{Runner: r, RunnerName: buildjob.RunnerKubernetes, Tenant: tenant, Env: "dev", Records: store}), d
	}
	var mu sync.Mutex
	var events []contract.Event
	emit := func(typ contract.EventType, payload any) {
		ev, _ := contract.NewEvent(conv, typ, payload)
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}

	first, _ := newServer()
	h, err := first.Open(buildmcp.Conversation{ID: conv, UID: uid, Emit: emit})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	answer := make(chan string, 1)
	go func() {
		for _, m := range []string{
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"claude-code","version":"2.1.332"}}}`,
			`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_build","arguments":{},"_meta":{"claudecode/toolUseId":"toolu_restart"}}}`,
		} {
			resp, err := h.HandleMCP(context.Background(), []byte(m))
			if err != nil {
				t.Error(err)
			}
			if strings.Contains(m, "tools/call") {
				answer <- string(resp)
			}
		}
	}()
	job := buildjob.JobName(buildjob.KindGradle, conv, "toolu_restart")
	var pod string
	for deadline := time.Now().Add(2 * time.Minute); pod == ""; time.Sleep(200 * time.Millisecond) {
		pods, _ := admin.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if len(pods.Items) == 1 && pods.Items[0].Status.Phase == corev1.PodRunning {
			pod = pods.Items[0].Name
		}
		if time.Now().After(deadline) {
			t.Fatal("the build's pod never ran")
		}
	}
	first.Detach() // the worker stops
	if a := <-answer; !strings.Contains(a, "restarting") {
		t.Errorf("the tool's answer as the worker stops: %s", a)
	}
	if _, err := admin.BatchV1().Jobs(ns).Get(context.Background(), job, metav1.GetOptions{}); err != nil {
		t.Fatalf("the build Job after the worker stopped: %v; want it running on", err)
	}
	// The build ends while no worker follows it.
	if _, err := admin.CoreV1().Pods(ns).Patch(context.Background(), pod, types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/metadata/labels/`+kubetest.HoldLabel+`"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		j, err := admin.BatchV1().Jobs(ns).Get(context.Background(), job, metav1.GetOptions{})
		if err == nil && finished(j) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the build Job never finished: %v", err)
		}
	}
	// An orphan: a Job of a build nothing records.
	orphan := gradleJob(t, tenant, "toolu_orphan", buildjob.Base{})
	if _, err := worker.BatchV1().Jobs(ns).Create(context.Background(), orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	second, d := newServer()
	mu.Lock()
	events = nil
	mu.Unlock()
	deliver := func(c string, typ contract.EventType, payload any) error {
		if c != conv {
			return buildmcp.ErrGone
		}
		emit(typ, payload)
		return nil
	}
	if err := second.Recover(context.Background(), deliver, d); err != nil {
		t.Fatal(err)
	}
	var done contract.BuildCompleted
	for deadline := time.Now().Add(2 * time.Minute); done.BuildID == ""; time.Sleep(200 * time.Millisecond) {
		mu.Lock()
		for _, ev := range events {
			if ev.Type == contract.EventBuildCompleted {
				_ = json.Unmarshal(ev.Data, &done)
			}
		}
		mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no build_completed after the restart")
		}
	}
	if done.BuildID != "toolu_restart" || !done.Recovered || done.Phase != buildjob.PhaseSucceeded || done.Tests != 4 || len(done.Failed) != 2 ||
		done.Failed[0].Message != "expected:<4> but was:<5>" {
		t.Errorf("delivered %+v", done)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, err := admin.BatchV1().Jobs(ns).Get(context.Background(), orphan.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphaned build Job was not deleted")
		}
	}
	if recs, _, _ := store.ListBuilds(); len(recs) != 0 {
		t.Errorf("records after delivery: %+v", recs)
	}
}
