package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/lease"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// Containment modes (Config.Containment).
const (
	// ContainmentStrict runs every agent in a jail (sandbox.Jail) and
	// refuses to start the worker when the host cannot build one.
	ContainmentStrict = "strict"
	// ContainmentWeak runs agents as plain child processes of their own
	// uid, for hosts that cannot give the worker what a jail needs. An
	// operator opts into it knowing what it loses (docs/security.md).
	ContainmentWeak = "weak"
)

// Agent network modes (Config.AgentNetwork).
const (
	AgentNetworkPrivate = "private"
	AgentNetworkHost    = "host"
)

// ParseContainment reads the containment settings from getenv:
// TALKIDE_CONTAINMENT (strict or weak), TALKIDE_CONTAINMENT_REQUIRE
// (guarantee names, comma-separated), TALKIDE_AGENT_MEMORY and
// TALKIDE_AGENT_DISK (bytes, with an optional KiB/MiB/GiB/TiB suffix, or
// "none"), TALKIDE_AGENT_PROCESSES and TALKIDE_AGENT_FILES (a count, or
// "none"),
// TALKIDE_AGENT_CPU_WEIGHT (1-10000), TALKIDE_AGENT_NETWORK (private or
// host) and TALKIDE_AGENT_READ_PATHS
// (comma-separated absolute paths agents see read-only besides
// sandbox.DefaultReadOnly). It fills the matching fields of c.
func ParseContainment(getenv func(string) string, c *Config) error {
	c.Containment = getenv("TALKIDE_CONTAINMENT")
	for _, name := range strings.Split(getenv("TALKIDE_CONTAINMENT_REQUIRE"), ",") {
		if name = strings.TrimSpace(name); name != "" {
			c.ContainmentRequire = append(c.ContainmentRequire, name)
		}
	}
	for name, dst := range map[string]*int64{"TALKIDE_AGENT_MEMORY": &c.AgentLimits.MemoryBytes, "TALKIDE_AGENT_DISK": &c.AgentLimits.DiskBytes} {
		if v := getenv(name); v != "" {
			n, err := ParseBytes(v)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			*dst = n
		}
	}
	if v := getenv("TALKIDE_AGENT_PROCESSES"); v != "" {
		if v == "none" {
			c.AgentLimits.Processes = -1
		} else if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 1 {
			return fmt.Errorf("TALKIDE_AGENT_PROCESSES %q: want a positive count or none", v)
		} else {
			c.AgentLimits.Processes = n
		}
	}
	switch c.AgentNetwork = getenv("TALKIDE_AGENT_NETWORK"); c.AgentNetwork {
	case "", AgentNetworkPrivate, AgentNetworkHost:
	default:
		return fmt.Errorf("TALKIDE_AGENT_NETWORK %q: want private or host", c.AgentNetwork)
	}
	if v := getenv("TALKIDE_AGENT_FILES"); v != "" {
		if v == "none" {
			c.AgentLimits.DiskFiles = -1
		} else if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 1 {
			return fmt.Errorf("TALKIDE_AGENT_FILES %q: want a positive count or none", v)
		} else {
			c.AgentLimits.DiskFiles = n
		}
	}
	if v := getenv("TALKIDE_AGENT_CPU_WEIGHT"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n < 1 || n > 10000 {
			return fmt.Errorf("TALKIDE_AGENT_CPU_WEIGHT %q: want 1-10000 (100 is an equal share)", v)
		}
		c.AgentLimits.CPUWeight = n
	}
	if v := getenv("TALKIDE_AGENT_READ_PATHS"); v != "" {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			if !strings.HasPrefix(p, "/") {
				return fmt.Errorf("TALKIDE_AGENT_READ_PATHS: %q is not an absolute path", p)
			}
			c.AgentReadPaths = append(c.AgentReadPaths, p)
		}
	}
	return nil
}

// cgroupName names this worker's group of agent groups: unique among the
// workers sharing the host (its id and incarnation), one path element.
func cgroupName(id lease.Identity) string {
	inc := id.Incarnation
	if len(inc) > 8 {
		inc = inc[:8]
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, id.Holder+"-"+inc)
}

var byteSize = regexp.MustCompile(`^([0-9]+)\s*(|B|K|KiB|M|MiB|G|GiB|T|TiB)$`)

// ParseBytes reads a size: a count of bytes with an optional binary suffix
// (K or KiB, M or MiB, G or GiB, T or TiB), or "none" (-1: no limit).
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "none" {
		return -1, nil
	}
	m := byteSize.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("size %q: want bytes with an optional KiB, MiB, GiB or TiB suffix, or none", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	shift := map[string]uint{"": 0, "B": 0, "K": 10, "KiB": 10, "M": 20, "MiB": 20, "G": 30, "GiB": 30, "T": 40, "TiB": 40}[m[2]]
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n << shift, nil
}

// validateContainment checks the containment settings (part of Validate).
func (c *Config) validateContainment() error {
	switch c.Containment {
	case "":
		c.Containment = ContainmentStrict
	case ContainmentStrict, ContainmentWeak:
	default:
		return fmt.Errorf("TALKIDE_CONTAINMENT %q: want strict or weak", c.Containment)
	}
	for _, name := range c.ContainmentRequire {
		if !slices.Contains(contract.Guarantees, name) {
			return fmt.Errorf("TALKIDE_CONTAINMENT_REQUIRE: %q is no guarantee (want some of %s)", name, strings.Join(contract.Guarantees, ", "))
		}
	}
	c.AgentLimits = c.AgentLimits.WithDefaults()
	return c.AgentLimits.Validate()
}

// newJail builds the agents' jail and checks, once, what this host gives
// it, with probe as the agent (nil: the worker's own user); agentUIDs says
// whether each conversation gets a uid of its own. It returns the jail
// (nil in weak mode) and the guarantees that hold here. Strict mode needs
// bubblewrap and namespaces (else an error says what is missing); a
// private /proc and a control group per agent are used where the host
// gives them and reported missing where not, unless the operator requires
// them (TALKIDE_CONTAINMENT_REQUIRE): then their absence is an error.
func newJail(c Config, name string, probe *sandbox.User, agentUIDs bool, log *slog.Logger) (*sandbox.Jail, contract.Containment, error) {
	rep := contract.Containment{Mode: c.Containment}
	add := func(name string, held bool, detail string) {
		rep.Guarantees = append(rep.Guarantees, contract.Guarantee{Name: name, Held: held, Detail: detail})
	}
	uidDetail := "each conversation's agent runs as a user id of its own"
	if !agentUIDs {
		uidDetail = "agents share one user id (TALKIDE_AGENT_USER, or a worker that is not root)"
	}
	userns, usernsDetail := inUserNamespace()
	if c.Containment == ContainmentWeak {
		log.Warn("agent containment is weak (TALKIDE_CONTAINMENT=weak): agents see every process of the host, have no memory, process or CPU limit, can leave processes behind that escape the worker's search, and no managed settings back the permission policy; use only where the host cannot give the worker a jail")
		add(contract.GuaranteeJail, false, "TALKIDE_CONTAINMENT=weak: agents run without a jail")
		add(contract.GuaranteePrivateProc, false, "TALKIDE_CONTAINMENT=weak")
		add(contract.GuaranteeCgroupLimits, false, "TALKIDE_CONTAINMENT=weak")
		add(contract.GuaranteeProcessLimit, false, "TALKIDE_CONTAINMENT=weak")
		add(contract.GuaranteeAgentUIDs, agentUIDs, uidDetail)
		add(contract.GuaranteeWorkerUserNamespace, userns, usernsDetail)
		add(contract.GuaranteePrivateNetwork, false, "TALKIDE_CONTAINMENT=weak: agents share the worker's network")
		return nil, rep, requireGuarantees(c, rep)
	}
	j := &sandbox.Jail{Limits: c.AgentLimits}
	var err error
	if j.Bwrap, err = exec.LookPath("bwrap"); err != nil {
		return nil, rep, errors.New("agent containment: bubblewrap (bwrap) is not installed: install it (Debian: apt-get install bubblewrap; make tools does) or set TALKIDE_CONTAINMENT=weak to run without it")
	}
	j.Prlimit, _ = exec.LookPath("prlimit")
	if len(c.AgentReadPaths) > 0 {
		j.ReadOnly = append(append([]string(nil), sandbox.DefaultReadOnly...), c.AgentReadPaths...)
	}
	cgroupDetail := ""
	if j.Cgroups, err = sandbox.OpenCgroups(name); err != nil {
		// A pod's cgroup is read-only unless the node's runtime makes it
		// writable: the rest of the jail still holds.
		cgroupDetail = "no writable control group (a pod's is read-only unless the node's runtime makes it writable: containerd's cgroup_writable, cgroup v2): " +
			"an agent's resident memory is sampled every second (over its limit, its turn is stopped), its /tmp, /var/tmp and /dev/shm are on disk (its disk use counts them), and when the worker's memory nears its limit the agent holding the most is stopped; " +
			"but an agent that allocates faster than the sampling, or holds memory no process maps (a memfd), can make the kernel end another conversation's largest process, and agents share the CPU without weights"
		log.Info("no control group per agent", "cause", err)
		j.Cgroups = nil
	}
	scratch, err := os.MkdirTemp("", "talkide-jail-check-")
	if err != nil {
		closeCgroups(j)
		return nil, rep, fmt.Errorf("agent containment: %w", err)
	}
	netDetail := "each agent has a network namespace of its own: it reaches its local gateway proxy (served inside it) and its own servers, and no service of the host or the pod, no other conversation and no internet"
	if c.AgentNetwork == AgentNetworkHost {
		netDetail = "TALKIDE_AGENT_NETWORK=host: agents share the worker's network (every service on its loopback, other conversations' servers, whatever the pod's NetworkPolicy allows)"
	} else if j.Helper, err = sandbox.InstallHelper(helperDir()); err != nil {
		if c.AgentNetwork == AgentNetworkPrivate {
			closeCgroups(j)
			return nil, rep, fmt.Errorf("agent containment: TALKIDE_AGENT_NETWORK=private, but %w", err)
		}
		netDetail = "the worker's binary cannot be given to agents' jails (" + err.Error() + "): agents share the worker's network"
	}
	err = j.Check(probe, scratch)
	if err != nil && j.Helper != "" && c.AgentNetwork == AgentNetworkPrivate {
		// Asked for by name: no fallback.
		closeCgroups(j)
		return nil, rep, fmt.Errorf("agent containment: TALKIDE_AGENT_NETWORK=private, but no network namespace could be made for agents here: %w", err)
	}
	if err != nil && j.Helper != "" {
		// A host that refuses agents a network namespace of their own
		// still gives them the rest of the jail.
		netErr := err
		j.Helper = ""
		if err = j.Check(probe, scratch); err == nil {
			netDetail = "no network namespace could be made for agents here (" + netErr.Error() + "): agents share the worker's network"
		}
	}
	if err != nil {
		closeCgroups(j)
		return nil, rep, fmt.Errorf("agent containment: %w (or set TALKIDE_CONTAINMENT=weak)", err)
	}
	add(contract.GuaranteeJail, true, "each agent runs in namespaces of its own (bubblewrap): its processes end with it, it sees only its conversation's files, and managed settings it cannot write carry the permission policy")
	if j.SharedProc {
		add(contract.GuaranteePrivateProc, false, "no procfs can be mounted here (the runtime masks the pod's /proc; an unmasked one needs hostUsers: false and procMount: Unmasked): agents see the pod's process list and command lines, though not other users' environments or memory, and cannot signal them")
	} else {
		add(contract.GuaranteePrivateProc, true, "each agent has a /proc of its own and sees only its own processes, and may make no user namespace of its own")
	}
	if j.Cgroups != nil {
		add(contract.GuaranteeCgroupLimits, true, fmt.Sprintf("a control group per agent (cgroup v%d): memory, processes and CPU weight", j.Cgroups.Version()))
		add(contract.GuaranteeProcessLimit, true, "by the agent's control group")
	} else {
		add(contract.GuaranteeCgroupLimits, false, cgroupDetail)
		if c.AgentLimits.Processes > 0 && j.Prlimit != "" && agentUIDs {
			add(contract.GuaranteeProcessLimit, true, "by the kernel's per-user process limit (RLIMIT_NPROC) of the agent's own uid")
		} else {
			add(contract.GuaranteeProcessLimit, false, "no control group, and no per-user limit that is the agent's alone (a uid per conversation and prlimit are needed)")
		}
	}
	add(contract.GuaranteeAgentUIDs, agentUIDs, uidDetail)
	add(contract.GuaranteeWorkerUserNamespace, userns, usernsDetail)
	add(contract.GuaranteePrivateNetwork, j.Helper != "", netDetail)
	if err := requireGuarantees(c, rep); err != nil {
		closeCgroups(j)
		return nil, rep, err
	}
	if j.Cgroups != nil {
		log.Info("agents run in jails", "cgroup_version", j.Cgroups.Version(), "private_proc", !j.SharedProc, "memory_bytes", c.AgentLimits.MemoryBytes,
			"processes", c.AgentLimits.Processes, "cpu_weight", c.AgentLimits.CPUWeight, "disk_bytes", c.AgentLimits.DiskBytes, "files", c.AgentLimits.DiskFiles)
	} else {
		// What holds without a cgroup: no CPU weight, memory by sampling.
		log.Info("agents run in jails", "cgroup_version", 0, "private_proc", !j.SharedProc, "sampled_memory_bytes", c.AgentLimits.MemoryBytes,
			"processes", c.AgentLimits.Processes, "disk_bytes", c.AgentLimits.DiskBytes, "files", c.AgentLimits.DiskFiles)
	}
	return j, rep, nil
}

// helperDir is where the jail's helper is copied when the worker's binary
// is not reachable by agents: /run/talkide, root's, where the worker is
// root; else a directory of the worker's user in the temp dir (InstallHelper
// refuses one someone else made).
func helperDir() string {
	if os.Geteuid() == 0 {
		return "/run/talkide/jail-helper"
	}
	return filepath.Join(os.TempDir(), "talkide-jail-helper-"+strconv.Itoa(os.Geteuid()))
}

func closeCgroups(j *sandbox.Jail) {
	if j != nil && j.Cgroups != nil {
		j.Cgroups.Close()
	}
}

// logContainment says at start which guarantees hold here and, as a
// warning, which do not and why (docs/security.md, "Agent containment").
func logContainment(rep contract.Containment, log *slog.Logger) {
	var held []string
	for _, g := range rep.Guarantees {
		if g.Held {
			held = append(held, g.Name)
		}
	}
	log.Info("agent containment", "mode", rep.Mode, "held", strings.Join(held, ","))
	for _, g := range rep.Guarantees {
		if !g.Held {
			log.Warn("agent containment is weaker here", "guarantee", g.Name, "detail", g.Detail)
		}
	}
}

// requireGuarantees refuses a worker whose host does not give a guarantee
// the operator requires (TALKIDE_CONTAINMENT_REQUIRE).
func requireGuarantees(c Config, rep contract.Containment) error {
	var miss []string
	for _, name := range c.ContainmentRequire {
		for _, g := range rep.Guarantees {
			if g.Name == name && !g.Held {
				miss = append(miss, fmt.Sprintf("%s (%s)", name, g.Detail))
			}
		}
	}
	if len(miss) > 0 {
		return fmt.Errorf("agent containment: TALKIDE_CONTAINMENT_REQUIRE asks for what this host does not give: %s", strings.Join(miss, "; "))
	}
	return nil
}

// inUserNamespace reports whether the worker runs in a user namespace that
// maps less than every id (a pod with hostUsers: false), from
// /proc/self/uid_map, with a sentence saying so.
func inUserNamespace() (bool, string) {
	lo, n, err := uidMapRange()
	if err != nil {
		return false, fmt.Sprintf("cannot read /proc/self/uid_map: %v", err)
	}
	if lo == 0 && n == 1<<32-1 {
		return false, "the worker runs in its host's user namespace, so its root is the host's root (in Kubernetes: a pod with hostUsers: true; where the session volume supports idmapped mounts, TALKIDE_WORKER_USER_NAMESPACE gives the pod a user namespace of its own)"
	}
	return true, fmt.Sprintf("the worker runs in a user namespace of its own (ids %d-%d inside): its root is an unprivileged uid on the node", lo, lo+n-1)
}

// uidMapRange returns the ids inside the worker's user namespace that map
// to the host: the first and how many, of the extent holding uid 0 (the
// whole range, 0 and 2^32-1, in the initial namespace).
func uidMapRange() (first, count uint64, err error) {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		in, err1 := strconv.ParseUint(f[0], 10, 64)
		n, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 == nil && err2 == nil && in == 0 {
			return in, n, nil
		}
	}
	return 0, 0, errors.New("uid 0 is not mapped")
}

// agentUIDRange is the range of per-conversation agent uids: configured
// (its First and Count set), else sandbox.DefaultUIDs, which a worker in a
// user namespace of 65536 ids (a pod with hostUsers: false) cannot map, so
// there the default is the upper part of its own range. A configured range
// outside the namespace is an error.
func agentUIDRange(configured sandbox.UIDRange) (sandbox.UIDRange, error) {
	lo, n, err := uidMapRange()
	if err != nil {
		return sandbox.UIDRange{}, fmt.Errorf("agent uids: %w", err)
	}
	return agentUIDRangeIn(configured, lo, n)
}

// agentUIDRangeIn is agentUIDRange in a user namespace mapping ids lo to
// lo+n-1.
func agentUIDRangeIn(configured sandbox.UIDRange, lo, n uint64) (sandbox.UIDRange, error) {
	fits := func(r sandbox.UIDRange) bool {
		return uint64(r.First) >= lo && uint64(r.First)+uint64(r.Count) <= lo+n
	}
	if configured.Count > 0 {
		r := sandbox.DefaultUIDs
		r.First, r.Count = configured.First, configured.Count
		if !fits(r) {
			return r, fmt.Errorf("agent uids %d-%d: the worker's user namespace maps only ids %d-%d", r.First, r.First+r.Count-1, lo, lo+n-1)
		}
		return r, nil
	}
	r := sandbox.DefaultUIDs
	if fits(r) {
		return r, nil
	}
	// Below 65534 (nobody), above the image's own accounts.
	r.First = userNamespaceFirstUID
	if uint64(r.First)+2 > lo+n {
		return r, fmt.Errorf("agent uids: the worker's user namespace maps only ids %d-%d, too few for agents of their own", lo, lo+n-1)
	}
	r.Count = uint32(min(uint64(sandbox.DefaultUIDs.Count), lo+n-2-uint64(r.First)))
	return r, nil
}

// userNamespaceFirstUID is the first agent uid in a user namespace of 65536
// ids: 20000 to 65533, 45534 conversations.
const userNamespaceFirstUID = 20000

// agentAccounts says whom agents run as when the worker can switch users:
// one user per conversation (a range of uids; the default for a root
// worker), so conversations cannot read each other either; or one fixed
// account; or the worker's own (both nil: "self", or a worker that is not
// root).
func agentAccounts(c Config, log *slog.Logger) (*sandbox.User, *sandbox.UIDRange, error) {
	switch {
	case c.AgentUser == "self":
		return nil, nil, nil
	case c.AgentUser == "per-conversation" || (c.AgentUser == "" && os.Geteuid() == 0):
		r, err := agentUIDRange(c.AgentUIDRange)
		if err != nil {
			return nil, nil, err
		}
		r.Dir = filepath.Join(c.SessionDir, "talkide", "agent-uids")
		r.HostDir = c.HostUIDDir
		log.Info("each conversation's agent runs as a user of its own", "first_uid", r.First, "uids", r.Count)
		return nil, &r, nil
	case c.AgentUser != "":
		u, err := sandbox.ParseUser(c.AgentUser)
		if err != nil {
			return nil, nil, err
		}
		log.Info("agents run as an unprivileged user", "uid", u.UID, "gid", u.GID)
		return &u, nil, nil
	}
	return nil, nil, nil
}

// containmentGauge is talkide_worker_containment: 1 for each guarantee
// rep says holds, 0 for each it says does not.
func containmentGauge(rep contract.Containment) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "talkide_worker_containment",
		Help: "1 for each agent-containment guarantee this worker's host gives, 0 for each it does not (docs/security.md, \"Agent containment\")."}, []string{"guarantee"})
	for _, gu := range rep.Guarantees {
		v := 0.0
		if gu.Held {
			v = 1
		}
		g.WithLabelValues(gu.Name).Set(v)
	}
	return g
}
