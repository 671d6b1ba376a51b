package realnode_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/worker/buildjob"
)

// TestBuildLogCutMidLine (issue 27, fault 4): a real container prints
// numbered lines and ends, its last line without a newline; its log is
// followed through a proxy that cuts the log responses in the middle of a
// line, dropped (the client reads an error) or ended cleanly (as the API
// server ends a response whose kubelet connection dropped). Every line
// arrives exactly once and whole, in order, the last one too: while the
// container runs (cut as it prints, in bursts of 50 lines a second) and
// when it had ended before the log was read (every cut after its end).
// The kubelet takes SinceTime in whole seconds, so a resumed stream
// replays the lines of that second: they are not passed on again. Before
// the fix, the fragment was passed on as a line and then the whole line
// again, and lines of the resumed second repeated.
func TestBuildLogCutMidLine(t *testing.T) {
	c := kubetest.SharedNode(t)
	const pad = "of a build's log, long enough that a cut falls inside it"
	const last = "the last line, without a newline"
	for _, tc := range []struct {
		name  string
		lines int
		// script prints the lines "line <i> <pad>" and last.
		script string
		// ended: the log is followed after the container ended.
		ended bool
		cuts  []kubetest.LogCut
	}{
		{"while it runs", 300,
			`i=1; while [ $i -le 300 ]; do echo "line $i ` + pad + `"; if [ $((i % 50)) -eq 0 ] && [ $i -lt 300 ]; then sleep 1; fi; i=$((i+1)); done; printf '` + last + `'`,
			false, []kubetest.LogCut{{At: 300}, {At: 300, Clean: true}, {At: 600}, {At: 200, Clean: true}}},
		{"after it ended", 500,
			`i=1; while [ $i -le 500 ]; do echo "line $i ` + pad + `"; i=$((i+1)); done; printf '` + last + `'`,
			true, []kubetest.LogCut{{At: 1000}, {At: 2500, Clean: true}, {At: 300}, {At: 7000, Clean: true}, {At: 4000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := c.Namespace(t)
			reader := c.ServiceAccountConfig(t, ns, "log-reader", []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get", "list"}}})
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "printer"}, Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](1),
				NodeSelector: map[string]string{kubetest.RealNodeLabel: "true"},
				Containers: []corev1.Container{{Name: "main", Image: kubetest.BusyboxImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", tc.script}}},
			}}
			admin := c.Client()
			if _, err := admin.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPodState(t, admin, ns, pod.Name, tc.ended)

			cfg, cutter := kubetest.NewLogCutter(t, reader, tc.cuts...)
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			d := &buildjob.Dispatcher{Kube: kube, Namespace: ns}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			var mu sync.Mutex
			var got []string
			err = d.FollowLogs(ctx, pod.Name, "main", func(l string) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, l)
			})
			mu.Lock()
			defer mu.Unlock()
			var reqs []string
			for _, r := range cutter.Requests() {
				reqs = append(reqs, r.String())
			}
			if err != nil {
				t.Fatalf("follow: %v after %d lines; requests:\n  %s", err, len(got), strings.Join(reqs, "\n  "))
			}
			var want []string
			for i := 1; i <= tc.lines; i++ {
				want = append(want, fmt.Sprintf("line %d %s", i, pad))
			}
			want = append(want, last)
			if !slices.Equal(got, want) {
				t.Errorf("%d lines, want %d, each once and whole: %s\nrequests:\n  %s", len(got), len(want), diffLines(got, want),
					strings.Join(reqs, "\n  "))
			}
			if n := cutter.Cuts(); n != len(tc.cuts) {
				t.Errorf("%d of %d cuts made; requests:\n  %s", n, len(tc.cuts), strings.Join(reqs, "\n  "))
			}
			t.Logf("%d lines through %d log requests, %d of them cut mid-line", len(got), len(reqs), cutter.Cuts())
		})
	}
}

// waitPodState waits until the pod's container runs (ended false) or the
// pod has succeeded (ended true).
func waitPodState(t *testing.T, kube kubernetes.Interface, ns, name string, ended bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		p, err := kube.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err == nil {
			if p.Status.Phase == corev1.PodFailed || !ended && p.Status.Phase == corev1.PodSucceeded {
				t.Fatalf("pod %s ended too soon: %+v", name, p.Status)
			}
			if ended && p.Status.Phase == corev1.PodSucceeded || !ended && p.Status.Phase == corev1.PodRunning {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: not %s in 2 minutes: %v %+v", name, map[bool]string{true: "succeeded", false: "running"}[ended], err, p)
		}
	}
}

// diffLines says where got first departs from want, and what repeats.
func diffLines(got, want []string) string {
	var b strings.Builder
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			fmt.Fprintf(&b, "line %d: got %q, want %q", i+1, g, w)
			break
		}
	}
	seen := map[string]int{}
	var repeated []string
	for _, l := range got {
		if seen[l]++; seen[l] == 2 {
			repeated = append(repeated, l)
		}
	}
	if len(repeated) > 0 {
		fmt.Fprintf(&b, "; %d lines repeated, first %q", len(repeated), repeated[0])
	}
	return b.String()
}
