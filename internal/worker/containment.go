package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/talkide/talkide/internal/lease"
	"github.com/talkide/talkide/internal/sandbox"
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

// ParseContainment reads the containment settings from getenv:
// TALKIDE_CONTAINMENT (strict or weak), TALKIDE_AGENT_MEMORY and
// TALKIDE_AGENT_DISK (bytes, with an optional KiB/MiB/GiB/TiB suffix, or
// "none"), TALKIDE_AGENT_PROCESSES (a count, or "none"),
// TALKIDE_AGENT_CPU_WEIGHT (1-10000) and TALKIDE_AGENT_READ_PATHS
// (comma-separated absolute paths agents see read-only besides
// sandbox.DefaultReadOnly). It fills the matching fields of c.
func ParseContainment(getenv func(string) string, c *Config) error {
	c.Containment = getenv("TALKIDE_CONTAINMENT")
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
	c.AgentLimits = c.AgentLimits.WithDefaults()
	return c.AgentLimits.Validate()
}

// newJail builds the agents' jail and checks, once, that this host can run
// it: with probe as the agent (nil: the worker's own user). In strict mode a
// host that cannot is an error that says what it lacks; in weak mode it
// gives no jail and a warning listing what does not hold.
func newJail(c Config, name string, probe *sandbox.User, log *slog.Logger) (*sandbox.Jail, error) {
	if c.Containment == ContainmentWeak {
		log.Warn("agent containment is weak (TALKIDE_CONTAINMENT=weak): agents see every process of the host, have no memory, process or CPU limit, can leave processes behind that escape the worker's search, and no managed settings back the permission policy; use only where the host cannot give the worker a jail")
		return nil, nil
	}
	j := &sandbox.Jail{Limits: c.AgentLimits}
	var err error
	if j.Bwrap, err = exec.LookPath("bwrap"); err != nil {
		return nil, errors.New("agent containment: bubblewrap (bwrap) is not installed: install it (Debian: apt-get install bubblewrap; make tools does) or set TALKIDE_CONTAINMENT=weak to run without it")
	}
	j.Prlimit, _ = exec.LookPath("prlimit")
	if len(c.AgentReadPaths) > 0 {
		j.ReadOnly = append(append([]string(nil), sandbox.DefaultReadOnly...), c.AgentReadPaths...)
	}
	if j.Cgroups, err = sandbox.OpenCgroups(name); err != nil {
		return nil, fmt.Errorf("agent containment: %w: the worker needs a writable cgroup (v2: a delegated /sys/fs/cgroup in its own cgroup namespace; v1: the memory and pids hierarchies) for the agents' limits, or TALKIDE_CONTAINMENT=weak", err)
	}
	scratch, err := os.MkdirTemp("", "talkide-jail-check-")
	if err != nil {
		j.Cgroups.Close()
		return nil, fmt.Errorf("agent containment: %w", err)
	}
	if err := j.Check(probe, scratch); err != nil {
		j.Cgroups.Close()
		return nil, fmt.Errorf("agent containment: %w (or set TALKIDE_CONTAINMENT=weak)", err)
	}
	log.Info("agents run in jails", "cgroup_version", j.Cgroups.Version(), "memory_bytes", c.AgentLimits.MemoryBytes,
		"processes", c.AgentLimits.Processes, "cpu_weight", c.AgentLimits.CPUWeight, "disk_bytes", c.AgentLimits.DiskBytes)
	return j, nil
}
