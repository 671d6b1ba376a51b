package realnode_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/provision"
	"github.com/talkide/talkide/internal/kubetest"
	"github.com/talkide/talkide/internal/platformtest"
)

// guarantee returns the named guarantee of a containment report.
func guarantee(t *testing.T, c *contract.Containment, name string) contract.Guarantee {
	t.Helper()
	if c == nil {
		t.Fatal("the status has no containment report from the worker")
	}
	i := slices.IndexFunc(c.Guarantees, func(g contract.Guarantee) bool { return g.Name == name })
	if i < 0 {
		t.Fatalf("containment report lacks %s: %+v", name, c)
	}
	return c.Guarantees[i]
}

// TestWorkerOnARealNode follows one tenant-env through its life on the
// real node, its session volume the NFS stand-in (a filesystem without
// idmapped mounts, as NFS):
//
//   - the worker pod the provisioner writes (the default: in the node's
//     user namespace, so any session volume mounts) runs with its real
//     security context and passes its probes; the status says which
//     containment guarantees hold there (no writable cgroup on a node as
//     it comes, no private /proc in a pod with hostUsers: true) instead of
//     refusing;
//   - a conversation runs end to end, its agent jailed in the pod: a uid
//     of its own, neither the session volume nor the worker's environment
//     in sight, a PID namespace of its own;
//   - the container is SIGKILLed, then the pod deleted: each time the
//     conversation goes on from the session volume and the browser's
//     stream (reconnecting with Last-Event-ID) has no gap and no repeat;
//   - the identity token is rotated through the kubelet's own update of
//     the Secret volume: no mint fails, the old token is refused after
//     its grace;
//   - a Gradle build Job of the builder image runs on the conversation's
//     working tree, as the agent's uid, and its failing test reaches the
//     conversation;
//   - deprovision leaves nothing of the tenant-env on the node.
func TestWorkerOnARealNode(t *testing.T) {
	c := node(t)
	p := startPlane(t, c, func(pc *provision.Config) {
		pc.StorageClass = kubetest.StorageClassNoIdmap
		// Longer than the kubelet takes to update a Secret volume.
		pc.Grace = 40 * time.Second
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var conv string
	var w *platformtest.Watcher
	turn := func(t *testing.T, text string) contract.Event {
		t.Helper()
		id := p.SendRetrying(conv, text)
		ev, ok := w.TurnEnd(id, 3*time.Minute)
		if !ok {
			t.Fatalf("turn %q did not end in 3 minutes; events %s\n%s", text, platformtest.Summary(w.Events()), p.describeWorker())
		}
		if ev.Type != contract.EventTurnCompleted {
			t.Fatalf("turn %q: %s %s", text, ev.Type, ev.Data)
		}
		return ev
	}
	// output is the last tool result of the events after n.
	output := func(after int) string {
		evs := w.Events()
		for i := len(evs) - 1; i >= after; i-- {
			if evs[i].Type == contract.EventToolResult {
				return platformtest.Payload[contract.ToolResult](t, evs[i]).Content
			}
		}
		return ""
	}
	noGaps := func(t *testing.T) {
		t.Helper()
		if g := w.Gaps(); g != "" {
			t.Errorf("the browser stream has gaps or repeats: %s\nevents: %s", g, platformtest.Summary(w.Events()))
		}
	}

	var podUIDs []string
	t.Run("pod", func(t *testing.T) {
		st := p.provision()
		pod := p.workerPod()
		podUIDs = append(podUIDs, string(pod.UID))
		if pod.Spec.NodeName != kubetest.NodeName {
			t.Fatalf("worker pod on %q, want the real node", pod.Spec.NodeName)
		}
		if pod.Spec.HostUsers == nil || !*pod.Spec.HostUsers {
			t.Errorf("hostUsers %v, want true (the default pod mounts any session volume)", pod.Spec.HostUsers)
		}
		sc := pod.Spec.Containers[0].SecurityContext
		if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("worker container security context %+v: want every capability dropped but the worker's own, no SYS_ADMIN, no privilege escalation", sc)
		}
		for _, s := range pod.Status.ContainerStatuses {
			if !s.Ready || s.RestartCount != 0 {
				t.Errorf("container %s ready=%v restarts=%d", s.Name, s.Ready, s.RestartCount)
			}
		}
		for name, held := range map[string]bool{
			contract.GuaranteeJail: true, contract.GuaranteeAgentUIDs: true, contract.GuaranteeProcessLimit: true,
			contract.GuaranteePrivateProc: false, contract.GuaranteeCgroupLimits: false, contract.GuaranteeWorkerUserNamespace: false, contract.GuaranteePrivateNetwork: true,
		} {
			if g := guarantee(t, st.Containment, name); g.Held != held || g.Detail == "" {
				t.Errorf("guarantee %s: held=%v (%s), want held=%v with a reason", name, g.Held, g.Detail, held)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("conversation", func(t *testing.T) {
		conv = p.NewConversationFrom("java-calculator")
		w = p.Watch(ctx, conv)
		n := len(w.Events())
		turn(t, "please run `id -u; ls /data/claude/workspaces | wc -l; ls /data/claude/talkide 2>&1; cat /proc/1/environ 2>&1 | head -c 300; echo; echo pid=$$`")
		out := output(n)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if uid, err := strconv.Atoi(strings.TrimSpace(lines[0])); err != nil || uid < 200000 {
			t.Errorf("the agent runs as uid %q, want one of its own (200000 and above)", lines[0])
		}
		if len(lines) < 3 || strings.TrimSpace(lines[1]) != "1" || !strings.Contains(lines[2], "No such file or directory") {
			t.Errorf("the agent sees more of the session volume than its own conversation's directories (other workspaces, the worker's state):\n%s", out)
		}
		if strings.Contains(out, "TALKIDE_") {
			t.Errorf("the agent read the worker's environment:\n%s", out)
		}
		if !strings.Contains(out, "Permission denied") {
			t.Errorf("reading the pod's pid 1 environment: want Permission denied:\n%s", out)
		}
		if pid := out[strings.LastIndex(out, "pid=")+4:]; strings.TrimSpace(pid) == "" || len(strings.TrimSpace(pid)) > 2 {
			t.Errorf("the agent's shell has pid %q: want a small one, in a PID namespace of its own", pid)
		}
		noGaps(t)
	})
	if t.Failed() {
		return
	}

	t.Run("container SIGKILL", func(t *testing.T) {
		pod := p.workerPod()
		init, err := c.ContainerPID(ctx, pod, "worker")
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(init, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p.waitRestarted(pod.Name, 1)
		turn(t, "please run `echo after-kill`")
		if out := output(0); !strings.Contains(out, "after-kill") {
			t.Errorf("after the kill: %q", out)
		}
		noGaps(t)
	})
	t.Run("pod delete", func(t *testing.T) {
		old := p.workerPod()
		if err := c.Client().CoreV1().Pods(p.namespace()).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		p.waitReplaced(old.Name)
		podUIDs = append(podUIDs, string(p.workerPod().UID))
		turn(t, "please run `echo after-delete`")
		if out := output(0); !strings.Contains(out, "after-delete") {
			t.Errorf("after the pod delete: %q", out)
		}
		resumed := false
		for _, ev := range w.Events() {
			if ev.Type == contract.EventSessionStarted && platformtest.Payload[contract.SessionStarted](t, ev).Resumed {
				resumed = true
			}
		}
		if !resumed {
			t.Errorf("no session_started with resumed: the new pod did not resume the CLI session from the volume; events %s", platformtest.Summary(w.Events()))
		}
		noGaps(t)
	})

	t.Run("identity rotation", func(t *testing.T) {
		oldTok := p.secretToken()
		before := p.mints.Load()
		if code, st, body := p.adminDo("POST", p.workerPath()+"/rotate-identity"); code != 200 || st.Identity == nil || len(st.Identity.Retiring) != 1 {
			t.Fatalf("rotate: %d %s", code, body)
		}
		// Turns go on while the kubelet updates the mounted Secret and
		// the grace runs out.
		deadline := time.Now().Add(3 * time.Minute)
		for i := 0; ; i++ {
			turn(t, fmt.Sprintf("please run `echo rotation-%d`", i))
			_, st, _ := p.adminDo("GET", p.workerPath())
			if st.Identity != nil && len(st.Identity.Retiring) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the old identity token was not retired in 3 minutes: %+v", st.Identity)
			}
			time.Sleep(2 * time.Second)
		}
		turn(t, "please run `echo after-rotation`")
		if code := p.mintCode(oldTok); code != http.StatusUnauthorized {
			t.Errorf("the old identity token after its grace: mint answered %d, want 401", code)
		}
		if p.mints.Load() == before {
			t.Error("no mint during the rotation: the test proves nothing")
		}
		if f := p.mintFailures.Load(); f != 0 {
			t.Errorf("%d mints failed during the rotation, want none", f)
		}
	})

	t.Run("gradle build job", func(t *testing.T) {
		n := len(w.Events())
		turn(t, "run the tests")
		var done *contract.BuildCompleted
		for _, ev := range w.Events()[n:] {
			if ev.Type == contract.EventBuildCompleted {
				b := platformtest.Payload[contract.BuildCompleted](t, ev)
				done = &b
			}
		}
		if done == nil {
			t.Fatalf("no build_completed; events %s", platformtest.Summary(w.Events()[n:]))
		}
		if done.Runner != "kubernetes" || done.Failures == 0 || len(done.Failed) == 0 {
			t.Fatalf("build %+v: want a Kubernetes Job whose failing test is reported", *done)
		}
		// The Job wrote the working tree as the agent: the agent can
		// read and remove what the build made.
		m := len(w.Events())
		turn(t, "please run `stat -c '%u %n' build/test-results/test/*.xml | head -1; id -u; rm -rf build && echo removed`")
		out := output(m)
		f := strings.Fields(out)
		if len(f) < 3 || f[0] != f[2] || !strings.Contains(out, "removed") {
			t.Errorf("the build's files do not belong to the agent (file uid, then agent uid):\n%s", out)
		}
	})

	t.Run("deprovision", func(t *testing.T) {
		pv := p.volumePath()
		if code, _, body := p.adminDo("DELETE", p.workerPath()); code != 200 && code != 202 {
			t.Fatalf("deprovision: %d %s", code, body)
		}
		p.waitPhase("Absent", 3*time.Minute)
		var left []string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			if left = c.NodeLeftovers(ctx, podUIDs, pv); len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("deprovision left on the node:\n  %s", strings.Join(left, "\n  "))
		}
	})
}

// TestMemoryGuardStopsTheAgentHoldingTheMost: in the default pod, agents
// have no cgroup of their own, and the kernel's OOM killer would end the
// largest process of the pod, whichever conversation's. As the pod nears
// its memory limit, the worker stops the agent holding the most first: the
// attacker's turn is stopped with a limit_reached event, the bystander's
// CLI survives and its next turn runs.
func TestMemoryGuardStopsTheAgentHoldingTheMost(t *testing.T) {
	c := node(t)
	p := startPlane(t, c, func(pc *provision.Config) {
		pc.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1536Mi")
		// Each agent's own limit above the pod's: only the guard acts.
		pc.Env = append(pc.Env, corev1.EnvVar{Name: "TALKIDE_AGENT_MEMORY", Value: "4GiB"})
	})
	p.provision()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	victim, attacker := p.NewConversation(), p.NewConversation()
	vw, aw := p.Watch(ctx, victim), p.Watch(ctx, attacker)
	turn := turnIn(t, p)
	if ev := turn(vw, victim, "please run `echo victim-ready`"); ev.Type != contract.EventTurnCompleted {
		t.Fatalf("victim's first turn: %s", ev.Data)
	}
	// 24 processes growing by 10 MB every 0.3 s to 80 MB each: about 1.9
	// GB within 3 s, more than the pod holds.
	turn(aw, attacker, "please run `for i in $(seq 24); do perl -e 'my @a; for (1..8) { push @a, q(a) x 10_000_000; select(undef,undef,undef,0.3) } sleep 60' & done; wait; echo attacker-done`")
	var guarded bool
	for _, ev := range aw.Events() {
		if ev.Type == contract.EventLimitReached {
			l := platformtest.Payload[contract.LimitReached](t, ev)
			guarded = guarded || l.Limit == contract.LimitMemory && strings.Contains(l.Message, "nearly exhausted")
		}
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "attacker-done") {
			t.Error("the attacker's turn ran to its end")
		}
	}
	if !guarded {
		t.Errorf("no limit_reached from the worker's memory guard for the attacker; events %s", platformtest.Summary(aw.Events()))
	}
	for _, ev := range vw.Events() {
		if ev.Type == contract.EventSessionStopped || ev.Type == contract.EventLimitReached {
			t.Errorf("the bystander's agent was stopped: %s %s", ev.Type, ev.Data)
		}
	}
	if ev := turn(vw, victim, "please run `echo victim-alive`"); ev.Type != contract.EventTurnCompleted {
		t.Errorf("the bystander's next turn: %s", ev.Data)
	}
	pod := p.workerPod()
	if rs := pod.Status.ContainerStatuses[0].RestartCount; rs != 0 {
		t.Errorf("the worker restarted %d times", rs)
	}
}

// TestParkedTmpFilesDoNotStopABystander: without a cgroup per agent, an
// agent's /tmp, /var/tmp and /dev/shm are on disk (its disk use counts
// them), not memory no one is charged for: an agent that parks a gigabyte
// there does not get a bystander doing ordinary work stopped as the
// agent "holding the most" of a worker short of memory.
func TestParkedTmpFilesDoNotStopABystander(t *testing.T) {
	c := node(t)
	p := startPlane(t, c, func(pc *provision.Config) {
		pc.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1536Mi")
	})
	p.provision()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	parker, bystander := p.NewConversation(), p.NewConversation()
	pw, bw := p.Watch(ctx, parker), p.Watch(ctx, bystander)
	turn := turnIn(t, p)
	if ev := turn(pw, parker, "please run `for d in /tmp /var/tmp /dev/shm; do head -c 400000000 /dev/zero > $d/park; done; df -h /tmp | tail -1`"); ev.Type != contract.EventTurnCompleted {
		t.Fatalf("parking: %s", ev.Data)
	}
	// Ordinary work of the bystander: 500 MB resident for a few seconds.
	if ev := turn(bw, bystander, "please run `perl -e 'my $x = q(a) x 500_000_000; sleep 8; print qq(bystander-done\\n)'`"); ev.Type != contract.EventTurnCompleted {
		t.Errorf("the bystander's turn: %s %s", ev.Type, ev.Data)
	}
	for _, ev := range bw.Events() {
		if ev.Type == contract.EventLimitReached || ev.Type == contract.EventSessionStopped {
			t.Errorf("the bystander was stopped: %s %s", ev.Type, ev.Data)
		}
	}
}

// turnIn returns a func that sends text to conv and returns the event that
// ended its turn (watched by w), failing the test if none did.
func turnIn(t *testing.T, p *plane) func(w *platformtest.Watcher, conv, text string) contract.Event {
	return func(w *platformtest.Watcher, conv, text string) contract.Event {
		t.Helper()
		ev, ok := w.TurnEnd(p.SendRetrying(conv, text), 3*time.Minute)
		if !ok {
			t.Fatalf("turn %q did not end; events %s\n%s", text, platformtest.Summary(w.Events()), p.describeWorker())
		}
		return ev
	}
}
