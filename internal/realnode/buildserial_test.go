package realnode_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/buildjob"
)

// A tiny Gradle project with one passing test, built offline with the
// image's JUnit 4 (as the sample java-calculator, without its bug).
var tinyProject = map[string]string{
	"settings.gradle": "rootProject.name = 'tiny'\n",
	"build.gradle": `apply plugin: 'java'
sourceCompatibility = '11'
targetCompatibility = '11'
dependencies {
    testCompile files('/usr/share/java/junit4.jar', '/usr/share/java/hamcrest-core.jar')
}
`,
	"src/main/java/com/acme/Greeter.java": `package com.acme;

public class Greeter {
    public String greet(String name) { return "hello " + name; }
}
`,
	"src/test/java/com/acme/GreeterTest.java": `package com.acme;

import static org.junit.Assert.assertEquals;
import org.junit.Test;

public class GreeterTest {
    @Test public void greets() { assertEquals("hello mara", new Greeter().greet("mara")); }
}
`,
}

// TestGradleJobsOfOneTreeRunOneAfterTheOther (issue 27, fault 6): two
// builds of one conversation asked for at once, real Gradle Jobs of the
// builder image on the real node, on the conversation's working tree on
// the session volume: the second Job is made only once the first has
// finished (the second is told it is queued), so Gradle's lock on the
// tree's own .gradle is never contended, and both succeed, each reporting
// the project's one passing test.
func TestGradleJobsOfOneTreeRunOneAfterTheOther(t *testing.T) {
	c := node(t)
	admin := c.Client()
	ctx := t.Context()
	tenant := "rnb" + strings.ToLower(token.NewID()[:8])
	ns := provision.Namespace(tenant, "dev")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: provision.PVCName},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To(kubetest.StorageClass),
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var volume string
	for deadline := time.Now().Add(time.Minute); volume == ""; time.Sleep(200 * time.Millisecond) {
		pvc, err := admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx, provision.PVCName, metav1.GetOptions{})
		if err == nil && pvc.Spec.VolumeName != "" {
			if pv, err := admin.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{}); err == nil && pv.Spec.HostPath != nil {
				volume = pv.Spec.HostPath.Path
			}
		}
		if _, err := admin.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			volume = "" // pods need the namespace's default ServiceAccount too
		}
		if volume == "" && time.Now().After(deadline) {
			t.Fatalf("no session volume or default ServiceAccount in %s: %v", ns, err)
		}
	}

	// The conversation's working tree, owned by its agent's uid.
	const conv, uid = "c_serial", 20771
	workspaces := filepath.Join(volume, "workspaces")
	tree := filepath.Join(workspaces, conv)
	if err := os.MkdirAll(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range tinyProject {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := filepath.Walk(tree, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	}); err != nil {
		t.Fatal(err)
	}

	worker, err := kubernetes.NewForConfig(c.ServiceAccountConfig(t, ns, provision.WorkerName, provision.WorkerRules()))
	if err != nil {
		t.Fatal(err)
	}
	r := &buildjob.KubeRunner{
		Dispatcher: &buildjob.Dispatcher{Kube: worker, Namespace: ns, MaxConcurrent: 2, PendingTimeout: 3 * time.Minute},
		// Small requests: the node is this machine.
		Gradle: &buildjob.GradleJobBuilder{Base: buildjob.Base{Image: images.builder, Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}}},
		WorkspaceRoot: workspaces, Offline: true,
	}
	type result struct {
		id     string
		rep    buildjob.Report
		err    error
		queued bool
	}
	results := make(chan result, 2)
	var wg sync.WaitGroup
	for _, id := range []string{"toolu_first", "toolu_second"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mu sync.Mutex
			queued := false
			req := buildjob.Request{Tenant: tenant, Env: "dev", Conversation: conv, ID: id, RunAsUser: uid}
			rep, err := r.Run(ctx, req, buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{Progress: func(p buildjob.Progress) {
				mu.Lock()
				defer mu.Unlock()
				queued = queued || p.Queued > 0
			}})
			mu.Lock()
			defer mu.Unlock()
			results <- result{id, rep, err, queued}
		}()
	}
	wg.Wait()
	close(results)
	queued := 0
	for res := range results {
		rep := res.rep
		if res.err != nil || rep.Outcome.Phase != buildjob.PhaseSucceeded || rep.ExitCode != 0 || rep.Results.Tests != 1 || len(rep.Results.Failed()) != 0 {
			t.Errorf("build %s: %v, outcome %+v, exit code %d, %d tests, failed %+v\nlog:\n%s", res.id, res.err, rep.Outcome, rep.ExitCode,
				rep.Results.Tests, rep.Results.Failed(), strings.Join(rep.LogTail, "\n"))
		}
		if res.queued {
			queued++
		}
	}
	if queued != 1 {
		t.Errorf("%d of the two builds were told they are queued, want one", queued)
	}

	// One after the other: the later Job was made after the earlier one
	// completed, and their containers ran apart.
	type span struct{ made, started, finished time.Time }
	var spans []span
	for _, id := range []string{"toolu_first", "toolu_second"} {
		name := buildjob.JobName(buildjob.KindGradle, conv, id)
		j, err := admin.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 || pods.Items[0].Status.ContainerStatuses[0].State.Terminated == nil {
			t.Fatalf("the pod of Job %s: %v %v", name, pods, err)
		}
		term := pods.Items[0].Status.ContainerStatuses[0].State.Terminated
		spans = append(spans, span{j.CreationTimestamp.Time, term.StartedAt.Time, term.FinishedAt.Time})
	}
	if spans[1].made.Before(spans[0].made) {
		spans[0], spans[1] = spans[1], spans[0]
	}
	// Times are whole seconds.
	if spans[1].made.Before(spans[0].finished) || spans[1].started.Before(spans[0].finished) {
		t.Errorf("two Gradle Jobs of one working tree overlapped: the first ran %v to %v, the second was made %v and started %v",
			spans[0].started, spans[0].finished, spans[1].made, spans[1].started)
	}
	t.Logf("first Job ran %v, second %v (made %v after the first finished)", spans[0].finished.Sub(spans[0].started),
		spans[1].finished.Sub(spans[1].started), spans[1].made.Sub(spans[0].finished))
}
