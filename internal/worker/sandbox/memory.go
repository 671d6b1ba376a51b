package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Memory without a control group per agent: where the worker's cgroup is
// read-only (a pod as clusters give it), an agent's memory is bounded by
// sampling. ResidentBytes measures a jail; OwnMemory the worker's own
// group (the pod), which the harness keeps below its limit by ending the
// jail that holds the most. Memory no process maps (a memfd, say) escapes
// the sampling: only a control group per agent bounds that.

// ResidentBytes is the resident memory of the jail's processes together
// (their resident set sizes, from /proc/<pid>/statm, which any user may
// read), in bytes. Shared pages count once per process, so it can exceed
// what the jail really holds, never fall short of what its processes map.
func (c *Cell) ResidentBytes() int64 {
	var total int64
	page := int64(os.Getpagesize())
	for _, pid := range c.Processes() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
		if err != nil {
			continue // exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		total += n * page
	}
	return total
}

// HasCgroup reports whether the jail has a control group of its own (and
// so memory, process and CPU limits the kernel enforces).
func (c *Cell) HasCgroup() bool { return c.cg != nil }

// OwnMemory reads the memory of the worker's own control group (its pod,
// in Kubernetes): the working set (usage less the inactive file cache the
// kernel reclaims first) and the limit, in bytes; a group without a limit
// has the host's memory as its limit. ok is false where neither cgroup v2
// nor v1's memory controller can be read.
func OwnMemory() (workingSet, limit int64, ok bool) {
	mounts, err := cgroupMounts()
	if err != nil {
		return 0, 0, false
	}
	own, err := ownCgroups()
	if err != nil {
		return 0, 0, false
	}
	host := hostMemory()
	if mnt, ok := mounts["cgroup2"]; ok {
		for _, dir := range []string{filepath.Join(mnt, own[""]), mnt} {
			cur := single(filepath.Join(dir, "memory.current"))
			if cur == 0 {
				continue
			}
			lim := host
			if b, err := os.ReadFile(filepath.Join(dir, "memory.max")); err == nil && strings.TrimSpace(string(b)) != "max" {
				lim, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			}
			return cur - keyed(filepath.Join(dir, "memory.stat"), "inactive_file"), min(lim, host), true
		}
	}
	if mnt, ok := mounts["memory"]; ok {
		// A container sees its own group at the mount's root; a host
		// process under its path.
		for _, dir := range []string{filepath.Join(mnt, own["memory"]), mnt} {
			use := single(filepath.Join(dir, "memory.usage_in_bytes"))
			if use == 0 {
				continue
			}
			lim := single(filepath.Join(dir, "memory.limit_in_bytes"))
			if lim <= 0 || lim > host {
				lim = host
			}
			return use - keyed(filepath.Join(dir, "memory.stat"), "total_inactive_file"), lim, true
		}
	}
	return 0, 0, false
}

// hostMemory is MemTotal of /proc/meminfo, in bytes.
func hostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 1 << 62
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 1 << 62
}
