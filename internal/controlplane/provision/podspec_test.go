package provision_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/talkide/talkide/internal/controlplane/provision"
)

// The worker's pod, as the two documented choices write it
// (docs/deploying.md, "Choosing the worker's pod"): by default in the
// node's user namespace (any session volume mounts), root with the few
// capabilities that give agents their uids and directories, no SYS_ADMIN,
// no privilege escalation, the node-wide uid claims mounted; with
// UserNamespace, a user namespace of its own, an unmasked /proc and no
// node-wide claims (its uids are its own). Either way seccomp and AppArmor
// are unconfined for bubblewrap, and the operator's placement and runtime
// class and required guarantees are passed on.
func TestWorkerPodSpecChoices(t *testing.T) {
	for _, userns := range []bool{false, true} {
		c := provision.Config{Image: "registry.example/talkide-worker:1", UserNamespace: userns, RuntimeClass: "talkide",
			NodeSelector: map[string]string{"pool": "workers"}, Tolerations: []corev1.Toleration{{Key: "pool", Operator: corev1.TolerationOpExists}},
			ContainmentRequire: []string{"agent-jail"}}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		pod := provision.WorkerDeployment(&c, "acme", "dev", "h").Spec.Template.Spec
		ctr := pod.Containers[0]
		sc := ctr.SecurityContext
		env := map[string]string{}
		for _, e := range ctr.Env {
			env[e.Name] = e.Value
		}
		hostPath := slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil })
		if pod.HostUsers == nil || *pod.HostUsers == userns {
			t.Errorf("userns=%v: hostUsers %v", userns, pod.HostUsers)
		}
		if (sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount) != userns {
			t.Errorf("userns=%v: procMount %v", userns, sc.ProcMount)
		}
		if hostPath == userns || (env["TALKIDE_HOST_UID_DIR"] == "none") != userns {
			t.Errorf("userns=%v: uid claims hostPath %v, TALKIDE_HOST_UID_DIR %q", userns, hostPath, env["TALKIDE_HOST_UID_DIR"])
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") ||
			!slices.Contains(sc.Capabilities.Add, "SETUID") || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Privileged != nil || *sc.RunAsUser != 0 {
			t.Errorf("userns=%v: container security context %+v", userns, sc)
		}
		if pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined || pod.SecurityContext.AppArmorProfile.Type != corev1.AppArmorProfileTypeUnconfined {
			t.Errorf("userns=%v: pod security context %+v", userns, pod.SecurityContext)
		}
		if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "talkide" || pod.NodeSelector["pool"] != "workers" || len(pod.Tolerations) != 1 ||
			env["TALKIDE_CONTAINMENT_REQUIRE"] != "agent-jail" {
			t.Errorf("userns=%v: placement %v %v %v, require %q", userns, pod.RuntimeClassName, pod.NodeSelector, pod.Tolerations, env["TALKIDE_CONTAINMENT_REQUIRE"])
		}
	}
	for name, c := range map[string]provision.Config{
		"a node by name":       {NodeSelector: map[string]string{"kubernetes.io/hostname": "n1"}},
		"every taint":          {Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
		"control-plane node":   {Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists}}},
		"a bad runtime class":  {RuntimeClass: "Not_A_Name"},
		"an unknown guarantee": {ContainmentRequire: []string{"all-of-them"}},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "TALKIDE_WORKER_") {
			t.Errorf("%s: %v, want a refusal naming the setting", name, err)
		}
	}
}
