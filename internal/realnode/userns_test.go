package realnode_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
)

// TestUserNamespaceWorker: with TALKIDE_WORKER_USER_NAMESPACE and a session
// volume whose filesystem supports idmapped mounts, the worker's pod runs
// in a user namespace of its own (its root an unprivileged uid on the node)
// and each agent gets a /proc of its own; the status reports both. Agents'
// uids lie inside the pod's 65536 ids, and a Gradle build Job, a pod of
// its own in the node's user namespace, writes the working tree as the
// same uid the agent has inside the worker's pod (the volume maps ids 1:1).
func TestUserNamespaceWorker(t *testing.T) {
	c := node(t)
	if f, _ := c.Node(); !f.UserNamespaces {
		t.Fatal("this machine's runc reports no idmapped mounts: the node cannot run hostUsers: false pods")
	}
	p := startPlane(t, c, func(pc *provision.Config) { pc.UserNamespace = true })
	st := p.provision()
	pod := p.workerPod()
	if pod.Spec.HostUsers == nil || *pod.Spec.HostUsers {
		t.Errorf("hostUsers %v, want false", pod.Spec.HostUsers)
	}
	for name, held := range map[string]bool{
		contract.GuaranteeJail: true, contract.GuaranteeAgentUIDs: true, contract.GuaranteeProcessLimit: true,
		contract.GuaranteePrivateProc: true, contract.GuaranteeWorkerUserNamespace: true, contract.GuaranteeCgroupLimits: false, contract.GuaranteePrivateNetwork: true,
	} {
		if g := guarantee(t, st.Containment, name); g.Held != held || g.Detail == "" {
			t.Errorf("guarantee %s: held=%v (%s), want held=%v with a reason", name, g.Held, g.Detail, held)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	conv := p.NewConversationFrom("java-calculator")
	w := p.Watch(ctx, conv)
	turn := func(text string) []contract.Event {
		t.Helper()
		n := len(w.Events())
		id := p.SendRetrying(conv, text)
		ev, ok := w.TurnEnd(id, 3*time.Minute)
		if !ok || ev.Type != contract.EventTurnCompleted {
			t.Fatalf("turn %q: %s %s; events %s\n%s", text, ev.Type, ev.Data, platformtest.Summary(w.Events()), p.describeWorker())
		}
		return w.Events()[n:]
	}
	lastOutput := func(evs []contract.Event) string {
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].Type == contract.EventToolResult {
				return platformtest.Payload[contract.ToolResult](t, evs[i]).Content
			}
		}
		return ""
	}
	out := lastOutput(turn("please run `id -u; ls /proc | grep -c '^[0-9]'`"))
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("output %q", out)
	}
	if uid, _ := strconv.Atoi(f[0]); uid < 20000 || uid > 65533 {
		t.Errorf("agent uid %s: want one inside the pod's user namespace (20000-65533)", f[0])
	}
	if n, _ := strconv.Atoi(f[1]); n > 10 {
		t.Errorf("the agent sees %d processes: want only its own (a private /proc)", n)
	}
	evs := turn("run the tests")
	var done *contract.BuildCompleted
	for _, ev := range evs {
		if ev.Type == contract.EventBuildCompleted {
			b := platformtest.Payload[contract.BuildCompleted](t, ev)
			done = &b
		}
	}
	if done == nil || done.Runner != "kubernetes" || done.Failures == 0 {
		t.Fatalf("build %+v: want a Kubernetes Job whose failing test is reported; events %s", done, platformtest.Summary(evs))
	}
	out = lastOutput(turn("please run `stat -c %u build/test-results/test; id -u; rm -rf build && echo removed`"))
	if f := strings.Fields(out); len(f) < 3 || f[0] != f[1] || f[2] != "removed" {
		t.Errorf("the build Job's files (owner, then the agent's uid):\n%s", out)
	}
}

// TestUserNamespaceWorkerOnNFSSaysWhy: a worker pod in a user namespace
// whose session volume lacks idmapped mounts (the NFS stand-in) cannot
// start; the status says so and what to do, instead of waiting forever.
func TestUserNamespaceWorkerOnNFSSaysWhy(t *testing.T) {
	c := node(t)
	p := startPlane(t, c, func(pc *provision.Config) {
		pc.UserNamespace = true
		pc.StorageClass = kubetest.StorageClassNoIdmap
	})
	if code, _, body := p.adminDo("PUT", p.workerPath()); code >= 300 {
		t.Fatalf("provision: %d %s", code, body)
	}
	st := p.waitPhase("Failed", 2*time.Minute)
	if st.Reason != provision.ReasonPodNotReady || !strings.Contains(st.Message, "TALKIDE_WORKER_USER_NAMESPACE=false") {
		t.Errorf("status %s %s: %s; want the pod's failure with what to do\n%s", st.Phase, st.Reason, st.Message, p.describeWorker())
	}
	if code, _, body := p.adminDo("DELETE", p.workerPath()); code != 200 && code != 202 {
		t.Fatalf("deprovision: %d %s", code, body)
	}
	p.waitPhase("Absent", 3*time.Minute)
}

// TestRequiredGuaranteeRefusedSaysWhy: an operator who requires a
// guarantee the nodes cannot give (a private /proc, from the default pod)
// gets a worker that refuses to start, and a status that names the
// guarantee and why it is missing, from the worker's own last words.
func TestRequiredGuaranteeRefusedSaysWhy(t *testing.T) {
	c := node(t)
	p := startPlane(t, c, func(pc *provision.Config) { pc.ContainmentRequire = []string{"private-proc"} })
	if code, _, body := p.adminDo("PUT", p.workerPath()); code >= 300 {
		t.Fatalf("provision: %d %s", code, body)
	}
	st := p.waitPhase("Failed", 2*time.Minute)
	if !strings.Contains(st.Message, "TALKIDE_CONTAINMENT_REQUIRE") || !strings.Contains(st.Message, "private-proc") {
		t.Errorf("status %s %s: %s; want the worker's refusal naming the guarantee\n%s", st.Phase, st.Reason, st.Message, p.describeWorker())
	}
	if code, _, body := p.adminDo("DELETE", p.workerPath()); code != 200 && code != 202 {
		t.Fatalf("deprovision: %d %s", code, body)
	}
	p.waitPhase("Absent", 3*time.Minute)
}
