package contract

// Names of the agent-containment guarantees a worker reports
// (docs/security.md, "Agent containment").
const (
	// GuaranteeJail: each agent runs in namespaces of its own (bubblewrap):
	// its processes end with its conversation, it sees only its own
	// conversation's files, nothing it writes loosens the permission policy.
	GuaranteeJail = "agent-jail"
	// GuaranteePrivateProc: the agent sees only its own processes (a new
	// /proc per agent; needs an unmasked /proc, so a pod with hostUsers:
	// false and procMount: Unmasked).
	GuaranteePrivateProc = "private-proc"
	// GuaranteeCgroupLimits: a control group per agent bounds its memory
	// and weighs its CPU (needs a writable cgroup: containerd's
	// cgroup_writable on cgroup v2, or a host, not a pod).
	GuaranteeCgroupLimits = "cgroup-limits"
	// GuaranteeProcessLimit: the agent's processes and threads are
	// bounded (by its control group, else by the kernel's per-user limit).
	GuaranteeProcessLimit = "process-limit"
	// GuaranteeAgentUIDs: each conversation's agent runs as a user id of
	// its own, so agents cannot read each other's files or processes.
	GuaranteeAgentUIDs = "agent-uids"
	// GuaranteeWorkerUserNamespace: the worker (root, to give agents
	// their uids) runs in a user namespace, so its root is an
	// unprivileged uid on the node (a pod with hostUsers: false).
	GuaranteeWorkerUserNamespace = "worker-user-namespace"
	// GuaranteePrivateNetwork: each agent has a network namespace of its
	// own, in which it reaches its local gateway proxy and its own
	// servers, and nothing of the host or of other conversations.
	GuaranteePrivateNetwork = "private-network"
)

// Guarantees lists every guarantee name, in the order reports give them.
var Guarantees = []string{GuaranteeJail, GuaranteePrivateProc, GuaranteeCgroupLimits, GuaranteeProcessLimit,
	GuaranteeAgentUIDs, GuaranteeWorkerUserNamespace, GuaranteePrivateNetwork}

// Guarantee is one containment guarantee and whether this worker's host
// gives it.
type Guarantee struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
	// Detail says how it holds, or what is missing and what would give it.
	Detail string `json:"detail"`
}

// Containment is what a worker's agent containment guarantees where it
// runs, as it found at start.
type Containment struct {
	// Mode is "strict" (agents jailed) or "weak" (TALKIDE_CONTAINMENT=weak).
	Mode       string      `json:"mode"`
	Guarantees []Guarantee `json:"guarantees"`
}

// Missing lists the names of the guarantees not held.
func (c Containment) Missing() []string {
	var out []string
	for _, g := range c.Guarantees {
		if !g.Held {
			out = append(out, g.Name)
		}
	}
	return out
}

// WorkerInfo is GET PathWorker's answer.
type WorkerInfo struct {
	// WorkerID is the replica that answered (its pod name in Kubernetes).
	WorkerID    string      `json:"worker_id"`
	Containment Containment `json:"containment"`
}
