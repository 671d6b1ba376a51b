package kubetest

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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

func TestMain(m *testing.M) { Main(m) }

// jobRules is what a worker needs to dispatch a build Job and read its
// output, in its own namespace.
var jobRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
}

func job(name string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: "example.invalid/build:1", Command: []string{"true"}}},
			}},
		},
	}
}

// TestServiceAccountRunsJobInItsNamespace: a ServiceAccount token limited
// by a Role creates a Job in its namespace, which the real Job controller,
// scheduler and a kwok node run to completion, and reads the pod's log;
// the same token is Forbidden in another namespace and cluster-wide.
func TestServiceAccountRunsJobInItsNamespace(t *testing.T) {
	c := Shared(t)
	ctx := t.Context()
	ns, other := c.Namespace(t), c.Namespace(t)
	worker, err := kubernetes.NewForConfig(c.ServiceAccountConfig(t, ns, "talkide-worker", jobRules))
	if err != nil {
		t.Fatal(err)
	}

	if _, err := worker.BatchV1().Jobs(other).Create(ctx, job("elsewhere"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create a Job in another namespace: got %v, want Forbidden", err)
	}
	if _, err := worker.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list Jobs in default: got %v, want Forbidden", err)
	}
	if _, err := worker.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list nodes (cluster-wide): got %v, want Forbidden", err)
	}
	if _, err := worker.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list Secrets in its own namespace (not granted): got %v, want Forbidden", err)
	}

	created, err := worker.BatchV1().Jobs(ns).Create(ctx, job("build"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a Job in its namespace: %v", err)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", created.Name).String()
			return worker.BatchV1().Jobs(ns).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", created.Name).String()
			return worker.BatchV1().Jobs(ns).Watch(ctx, o)
		},
	}
	ev, err := watchtools.UntilWithSync(ctx, lw, &batchv1.Job{}, nil, func(e watch.Event) (bool, error) {
		j, ok := e.Object.(*batchv1.Job)
		if !ok {
			return false, nil
		}
		for _, cond := range j.Status.Conditions {
			if cond.Status == corev1.ConditionTrue && (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("watch the Job: %v", err)
	}
	if j := ev.Object.(*batchv1.Job); j.Status.Succeeded != 1 {
		t.Fatalf("Job finished with %d succeeded, conditions %+v; want Complete with 1", j.Status.Succeeded, j.Status.Conditions)
	}

	pods, err := worker.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + created.Name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the Job's pods: %v, %v; want one", pods, err)
	}
	pod := pods.Items[0]
	if !strings.HasPrefix(pod.Spec.NodeName, "fake-node-") || pod.Status.Phase != corev1.PodSucceeded {
		t.Errorf("pod on node %q in phase %s; want a fake node and Succeeded", pod.Spec.NodeName, pod.Status.Phase)
	}
	logs, err := worker.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "main"}).Stream(ctx)
	if err != nil {
		t.Fatalf("stream the pod's log: %v", err)
	}
	b, err := io.ReadAll(logs)
	logs.Close()
	if err != nil || !strings.Contains(string(b), FakeLogLine) {
		t.Errorf("pod log %q, %v; want %q", b, err, FakeLogLine)
	}

	if err := worker.BatchV1().Jobs(ns).Delete(ctx, created.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Errorf("delete the Job: %v", err)
	}
}

// TestMakefileNamesTheSameBinDir: `make cluster-bins` decides from the
// Makefile whether to build, the tests look in BinDir; both must name one
// directory or every version change would build twice.
func TestMakefileNamesTheSameBinDir(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^K8S_BIN_DIR := (.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no K8S_BIN_DIR := line")
	}
	v := Pinned()
	got := strings.NewReplacer("$(CURDIR)", root, "$(K8S_VERSION)", v.Kubernetes, "$(ETCD_VERSION)", v.Etcd, "$(KWOK_VERSION)", v.Kwok).Replace(string(m[1]))
	t.Setenv("TALKIDE_K8S_BIN_DIR", "")
	if want := BinDir(root, v); got != want {
		t.Errorf("Makefile's K8S_BIN_DIR is %s, want %s", got, want)
	}
}

func TestParseVersions(t *testing.T) {
	v, err := parseVersions("# c\nK8S_VERSION=1.2.3\n\nETCD_VERSION = 3.4.5\nKWOK_VERSION=0.1.0\n" +
		"CONTAINERD_VERSION=2.0.0\nRUNC_VERSION=1.0.0\nCNI_PLUGINS_VERSION=1.1.0\nCOREDNS_VERSION=1.2.0\n")
	want := Versions{Kubernetes: "1.2.3", Etcd: "3.4.5", Kwok: "0.1.0", Containerd: "2.0.0", Runc: "1.0.0", CNIPlugins: "1.1.0", CoreDNS: "1.2.0"}
	if err != nil || v != want {
		t.Errorf("got %+v, %v", v, err)
	}
	if v.Key() != "k8s-1.2.3_etcd-3.4.5_kwok-0.1.0" || v.NodeKey() != "node-k8s-1.2.3_containerd-2.0.0_runc-1.0.0_cni-1.1.0_coredns-1.2.0" {
		t.Errorf("keys %s and %s", v.Key(), v.NodeKey())
	}
	if _, err := parseVersions("K8S_VERSION=1.2.3\n"); err == nil {
		t.Error("missing versions: got no error")
	}
}

// A cluster whose component died while starting, or whose port was taken
// meanwhile, is started again; other failures are not retried.
func TestRetryableStart(t *testing.T) {
	for msg, want := range map[string]bool{
		"kubetest: waiting for node fake-node-0 Ready and untainted: kwok exited (exit status 2); end of /tmp/x/kwok.log:\npanic": true,
		"listen tcp 127.0.0.1:4001: bind: address already in use":                                                                 true,
		"kubetest: missing kwok (build the binaries with `make cluster-bins`)":                                                    false,
	} {
		if got := retryableStart(errors.New(msg)); got != want {
			t.Errorf("retryableStart(%q) = %v, want %v", msg, got, want)
		}
	}
}
