package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Cgroups places each conversation's agent in a control group of its own,
// below the worker's own group: <worker's group>/talkide/<name>/<conversation>.
// The group carries the conversation's limits (memory, processes, CPU
// weight), counts the times a limit was hit, and ends every process in it at
// once.
//
// It works with the unified hierarchy (cgroup v2, where the worker needs a
// delegated, writable group: a container with its own cgroup namespace and a
// writable /sys/fs/cgroup) and with the legacy per-controller hierarchies
// (cgroup v1, as on hosts booted in hybrid mode). On v2 the worker moves
// itself into a leaf group <own>/worker so that its own group may enable
// controllers for children (the "no internal processes" rule).
type Cgroups struct {
	// v2 is the worker's directory of agent groups on the unified
	// hierarchy, or "" on v1.
	v2 string
	// v1 maps a legacy controller (memory, pids, cpu) to the worker's
	// directory of agent groups in that controller's hierarchy.
	v1 map[string]string
	// seq numbers the groups New makes.
	seq atomic.Uint64
}

// Controllers the agent groups use.
var cgroupControllers = []string{"memory", "pids", "cpu"}

// ErrNoCgroups is returned by OpenCgroups when no writable control-group
// hierarchy with the memory and pids controllers is available.
var ErrNoCgroups = errors.New("no writable cgroup hierarchy with the memory and pids controllers")

// OpenCgroups finds the worker's own control groups (from /proc/self/cgroup
// and /proc/self/mountinfo) and prepares <own>/talkide/<name> for the
// agents' groups; name must be unique among the workers sharing the host's
// groups (the worker's id and incarnation). A group of that name is emptied
// (its processes killed) and removed first. Groups of other names are left
// alone: they may belong to live workers. (The empty group of a worker that
// crashed stays until the host's or pod's cgroup goes; it holds nothing.)
// Errors: ErrNoCgroups (wrapped, with the reason) when there is no usable
// hierarchy.
func OpenCgroups(name string) (*Cgroups, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup name %q: want one path element", name)
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	// Pure v2: /sys/fs/cgroup (or wherever cgroup2 is mounted) has the
	// controllers; in hybrid mode the unified hierarchy has none of them.
	if mnt, ok := mounts["cgroup2"]; ok {
		dir := filepath.Join(mnt, own[""])
		ctrl, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if hasWords(string(ctrl), "memory", "pids") {
			c, err := openV2(dir, name)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrNoCgroups, err)
			}
			return c, nil
		}
	}
	c := &Cgroups{v1: map[string]string{}}
	for _, ctl := range cgroupControllers {
		mnt, ok := mounts[ctl]
		if !ok {
			continue
		}
		base := filepath.Join(mnt, own[ctl], "talkide", name)
		if err := resetGroup(base); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoCgroups, err)
		}
		if err := os.MkdirAll(base, 0o755); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoCgroups, err)
		}
		c.v1[ctl] = base
	}
	if c.v1["memory"] == "" || c.v1["pids"] == "" {
		return nil, fmt.Errorf("%w: the memory and pids controllers are not mounted (mounted: %v)", ErrNoCgroups, keys(mounts))
	}
	return c, nil
}

func openV2(own, name string) (*Cgroups, error) {
	// The worker's own group may only hand controllers to children while
	// no process sits in it: move every process of it into a leaf.
	procs, _ := os.ReadFile(filepath.Join(own, "cgroup.procs"))
	if len(bytes.TrimSpace(procs)) > 0 {
		leaf := filepath.Join(own, "worker")
		if err := os.MkdirAll(leaf, 0o755); err != nil {
			return nil, err
		}
		for _, pid := range strings.Fields(string(procs)) {
			// A process that exited meanwhile cannot be moved; ignore it.
			_ = os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(pid), 0)
		}
	}
	enable := "+memory +pids +cpu"
	if err := enableControllers(own, enable); err != nil {
		return nil, err
	}
	top := filepath.Join(own, "talkide")
	if err := os.MkdirAll(top, 0o755); err != nil {
		return nil, err
	}
	if err := enableControllers(top, enable); err != nil {
		return nil, err
	}
	base := filepath.Join(top, name)
	if err := resetGroup(base); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, err
	}
	if err := enableControllers(base, enable); err != nil {
		return nil, err
	}
	return &Cgroups{v2: base}, nil
}

// enableControllers writes each of the space-separated "+ctl" words to
// dir's cgroup.subtree_control; cpu is optional (some hosts do not delegate it).
func enableControllers(dir, words string) error {
	for _, w := range strings.Fields(words) {
		err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(w), 0)
		if err != nil && w != "+cpu" {
			return fmt.Errorf("enable %s in %s: %w", w[1:], dir, err)
		}
	}
	return nil
}

// Close kills whatever is left in the worker's agent groups and removes
// them. Call it when no jail of the worker runs any more.
func (c *Cgroups) Close() {
	if c.v2 != "" {
		_ = resetGroup(c.v2)
	}
	for _, d := range c.v1 {
		_ = resetGroup(d)
	}
}

// Version is 2 on the unified hierarchy, 1 on legacy hierarchies.
func (c *Cgroups) Version() int {
	if c.v2 != "" {
		return 2
	}
	return 1
}

// Cgroup is one conversation's control group.
type Cgroup struct {
	// dirs are the group's directories: one on v2, one per controller on v1.
	dirs map[string]string
	v2   bool

	// counters are the files Counters reads, opened at its first call and
	// read again from their start at each (an agent's limits are checked
	// every second: this saves two opens a second per agent); closed by
	// Remove, after which Counters reads 0 and opens nothing; guarded by
	// countersMu.
	countersMu sync.Mutex
	counters   [2]*counterFile
	removed    bool
}

// counterFile is an open cgroup file of "key value" lines.
type counterFile struct {
	path, key string
	f         *os.File
}

// read returns the value of the file's key, reading it from its start (a
// cgroup file shows its current values at each read from offset 0). It
// opens the file at its first call; a file the host does not have, or
// cannot read, reads 0 and is tried again next time.
func (c *counterFile) read() int64 {
	if c.f == nil {
		f, err := os.Open(c.path)
		if err != nil {
			return 0
		}
		c.f = f
	}
	var buf [1024]byte
	n, err := c.f.ReadAt(buf[:], 0)
	if err != nil && err != io.EOF {
		c.close()
		return 0
	}
	return keyedValue(buf[:n], c.key)
}

func (c *counterFile) close() {
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
}

// New creates a group for one process of conv with limits l, named
// <conv>.<n> with n unique in c: a process of conv that is still being
// reaped keeps its own group, so its clean-up never touches the next
// one's. The group is empty: Add puts processes in it.
func (c *Cgroups) New(conv string, l Limits) (*Cgroup, error) {
	if conv == "" || strings.ContainsAny(conv, "/\x00") || conv == "." || conv == ".." {
		return nil, fmt.Errorf("cgroup of %q: want one path element", conv)
	}
	conv = conv + "." + strconv.FormatUint(c.seq.Add(1), 10)
	g := &Cgroup{dirs: map[string]string{}, v2: c.v2 != ""}
	if g.v2 {
		g.dirs[""] = filepath.Join(c.v2, conv)
	} else {
		for ctl, base := range c.v1 {
			g.dirs[ctl] = filepath.Join(base, conv)
		}
	}
	for _, d := range g.dirs {
		if err := resetGroup(d); err != nil {
			return nil, err
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
	}
	if err := g.apply(l); err != nil {
		g.Remove()
		return nil, err
	}
	return g, nil
}

func (g *Cgroup) apply(l Limits) error {
	set := func(ctl, file, val string) error {
		d := g.dirs[ctl]
		if g.v2 {
			d = g.dirs[""]
		}
		if d == "" {
			return nil // controller not mounted (v1 cpu): limit not enforced
		}
		if err := os.WriteFile(filepath.Join(d, file), []byte(val), 0); err != nil {
			return fmt.Errorf("set %s: %w", file, err)
		}
		return nil
	}
	var errs []error
	if g.v2 {
		if l.MemoryBytes > 0 {
			errs = append(errs, set("", "memory.max", strconv.FormatInt(l.MemoryBytes, 10)))
			// No swap: the limit is the agent's real footprint. Absent
			// when the host has no swap accounting.
			_ = set("", "memory.swap.max", "0")
		}
		if l.Processes > 0 {
			errs = append(errs, set("", "pids.max", strconv.FormatInt(l.Processes, 10)))
		}
		if l.CPUWeight > 0 {
			_ = set("", "cpu.weight", strconv.FormatUint(l.CPUWeight, 10)) // cpu may not be delegated
		}
		return errors.Join(errs...)
	}
	if l.MemoryBytes > 0 {
		errs = append(errs, set("memory", "memory.limit_in_bytes", strconv.FormatInt(l.MemoryBytes, 10)))
		_ = set("memory", "memory.memsw.limit_in_bytes", strconv.FormatInt(l.MemoryBytes, 10))
	}
	if l.Processes > 0 {
		errs = append(errs, set("pids", "pids.max", strconv.FormatInt(l.Processes, 10)))
	}
	if l.CPUWeight > 0 {
		// v1 shares: 1024 is the default weight of 100.
		errs = append(errs, set("cpu", "cpu.shares", strconv.FormatUint(max(2, l.CPUWeight*1024/100), 10)))
	}
	return errors.Join(errs...)
}

// Add moves process pid (all its threads) into the group.
func (g *Cgroup) Add(pid int) error {
	for _, d := range g.dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move process %d into its cgroup: %w", pid, err)
		}
	}
	return nil
}

// Counters are how often a conversation's group hit its limits.
type Counters struct {
	// OOMKills counts processes the kernel killed for the memory limit.
	OOMKills int64
	// ProcessLimitHits counts forks refused by the process limit.
	ProcessLimitHits int64
}

// Counters reads the group's counters; a counter the host does not keep
// reads 0, and so does every counter after Remove. It keeps the two files
// open until Remove.
func (g *Cgroup) Counters() Counters {
	g.countersMu.Lock()
	defer g.countersMu.Unlock()
	if g.removed {
		return Counters{}
	}
	if g.counters[0] == nil {
		if g.v2 {
			d := g.dirs[""]
			g.counters = [2]*counterFile{{path: filepath.Join(d, "memory.events"), key: "oom_kill"},
				{path: filepath.Join(d, "pids.events"), key: "max"}}
		} else {
			g.counters = [2]*counterFile{{path: filepath.Join(g.dirs["memory"], "memory.oom_control"), key: "oom_kill"},
				{path: filepath.Join(g.dirs["pids"], "pids.events"), key: "max"}}
		}
	}
	return Counters{OOMKills: g.counters[0].read(), ProcessLimitHits: g.counters[1].read()}
}

// closeCounters closes the files Counters keeps open, for good.
func (g *Cgroup) closeCounters() {
	g.countersMu.Lock()
	defer g.countersMu.Unlock()
	g.removed = true
	for _, c := range g.counters {
		if c != nil {
			c.close()
		}
	}
}

// Processes returns the ids of the processes in the group.
func (g *Cgroup) Processes() []int {
	d := g.dirs["pids"]
	if g.v2 {
		d = g.dirs[""]
	}
	return readPids(d)
}

// Kill ends every process in the group with SIGKILL (cgroup.kill on v2,
// else signalling each member until none is left). It returns once the
// group is empty or after 5 s.
func (g *Cgroup) Kill() {
	for _, d := range g.dirs {
		killGroup(d)
	}
}

// Remove kills what is left in the group and removes it.
func (g *Cgroup) Remove() {
	g.closeCounters()
	for _, d := range g.dirs {
		_ = resetGroup(d)
	}
}

// killGroup ends every process of the group at dir and of its children.
func killGroup(dir string) {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		waitEmpty(dir)
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		pids := readPids(dir)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitEmpty(dir string) {
	deadline := time.Now().Add(5 * time.Second)
	for len(readPids(dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// resetGroup kills everything in the group at dir (children first) and
// removes it; a missing group is fine.
func resetGroup(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := resetGroup(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	killGroup(dir)
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

func readPids(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// keyedValue returns the value of key in b's "key value" lines, 0 when
// it has none.
func keyedValue(b []byte, key string) int64 {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(line, []byte(" "))
		if ok && string(k) == key {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}

// keyed reads the "key value" lines of the file at path and returns the
// value of key, or 0.
func keyed(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return keyedValue(b, key)
}

func single(path string) int64 {
	b, _ := os.ReadFile(path)
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// cgroupMounts maps "cgroup2" and each legacy controller name to its mount
// point, from /proc/self/mountinfo.
func cgroupMounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		switch qf[0] {
		case "cgroup2":
			if _, seen := out["cgroup2"]; !seen {
				out["cgroup2"] = pf[4]
			}
		case "cgroup":
			for _, opt := range strings.Split(qf[2], ",") {
				for _, ctl := range cgroupControllers {
					if opt == ctl {
						out[ctl] = pf[4]
					}
				}
			}
		}
	}
	return out, sc.Err()
}

// ownCgroups maps "" (the unified hierarchy) and each legacy controller
// to the worker's own group path, from /proc/self/cgroup.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			out[ctl] = parts[2]
		}
	}
	return out, nil
}

func hasWords(s string, words ...string) bool {
	f := strings.Fields(s)
	for _, w := range words {
		found := false
		for _, x := range f {
			found = found || x == w
		}
		if !found {
			return false
		}
	}
	return true
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
