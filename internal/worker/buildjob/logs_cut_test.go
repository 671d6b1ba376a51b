package buildjob_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/worker/buildjob"
)

// A log stream cut in the middle of a line (issue 27, fault 4) passes on
// neither the fragment nor the line twice, and loses nothing, whether the
// cut comes while the container runs or after it ended, dropped (the
// client reads an error) or ended cleanly (as the API server ends a log
// response whose kubelet connection dropped). Before the fix, the fragment
// was passed on as a line and then the whole line after the resume, or,
// when the container had ended, the fragment alone.
//
// kwok plays the kubelet: a container's log is the one line
// kubetest.FakeLogLine ("<timestamp> kubetest: fake container output",
// some 62 bytes), so byte 10 is inside the timestamp and bytes 45 and 50
// inside the text. A proxy between the client and the API server cuts the
// log responses. The real node's test (internal/realnode,
// TestBuildLogCutMidLine) does the same with a real container's many lines.
func TestFollowLogsCutMidLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		// running: the container still runs when the log is followed
		// (it ends once its line has arrived); else it ended before.
		running bool
		cuts    []kubetest.LogCut
	}{
		{"running: dropped in the timestamp, then after it ended in the text", true,
			[]kubetest.LogCut{{At: 10}, {}, {At: 45}}},
		{"running: ended in the text, then after it ended in the timestamp", true,
			[]kubetest.LogCut{{At: 45, Clean: true}, {}, {At: 10, Clean: true}}},
		{"ended: ended in the text", false,
			[]kubetest.LogCut{{At: 45, Clean: true}}},
		{"ended: dropped in the text, twice", false,
			[]kubetest.LogCut{{At: 45}, {At: 50}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := kubetest.Shared(t)
			admin := c.Client()
			ns := c.Namespace(t)
			reader := c.ServiceAccountConfig(t, ns, "log-reader", []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get", "list"}}})
			pod := kwokJobPod(t, admin, ns, tc.running)

			cfg, cutter := kubetest.NewLogCutter(t, reader, tc.cuts...)
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			d := &buildjob.Dispatcher{Kube: kube, Namespace: ns}
			var mu sync.Mutex
			var got []string
			arrived := make(chan struct{})
			var once sync.Once
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- d.FollowLogs(ctx, pod, "main", func(l string) {
					mu.Lock()
					got = append(got, l)
					mu.Unlock()
					if l == kubetest.FakeLogLine {
						once.Do(func() { close(arrived) })
					}
				})
			}()
			if tc.running {
				select {
				case <-arrived:
				case err := <-done:
					t.Fatalf("following a running container's log ended: %v; lines %q; requests %v", err, got, cutter.Requests())
				case <-ctx.Done():
					t.Fatalf("the line never arrived; lines %q; requests %v", got, cutter.Requests())
				}
				// The container ends.
				if _, err := admin.CoreV1().Pods(ns).Patch(ctx, pod, types.JSONPatchType,
					[]byte(`[{"op":"remove","path":"/metadata/labels/`+kubetest.HoldLabel+`"}]`), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("follow: %v; lines %q; requests %v", err, got, cutter.Requests())
			}
			mu.Lock()
			defer mu.Unlock()
			want := 0
			for _, cut := range tc.cuts {
				if cut.At > 0 {
					want++
				}
			}
			if !slices.Equal(got, []string{kubetest.FakeLogLine}) || cutter.Cuts() != want {
				t.Errorf("lines %q after %d of %d cuts; want the container's one line, once\nrequests:\n  %s", got, cutter.Cuts(), want,
					strings.Join(logRequests(cutter), "\n  "))
			}
		})
	}
}

func logRequests(c *kubetest.LogCutter) []string {
	var out []string
	for _, r := range c.Requests() {
		out = append(out, r.String())
	}
	return out
}

// kwokJobPod runs a Job of one container "main" on kwok and returns its
// pod's name once the container runs (held, running) or has ended.
func kwokJobPod(t *testing.T, admin kubernetes.Interface, ns string, running bool) string {
	t.Helper()
	labels := map[string]string{}
	if running {
		labels[kubetest.HoldLabel] = "1"
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "logs"}, Spec: batchv1.JobSpec{
		BackoffLimit: ptr.To[int32](0),
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "registry.example/logs:1"}},
		}},
	}}
	if _, err := admin.BatchV1().Jobs(ns).Create(t.Context(), job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		pods, err := admin.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=logs"})
		if err == nil && len(pods.Items) == 1 {
			p := pods.Items[0]
			if running && p.Status.Phase == corev1.PodRunning || !running && p.Status.Phase == corev1.PodSucceeded {
				return p.Name
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Job's pod is not %s: %v %v", map[bool]string{true: "running", false: "done"}[running], pods, err)
		}
	}
}
