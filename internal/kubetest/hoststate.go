package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// hostState is what of the host a real node may change, read before it
// starts and after it stops: a difference is something its teardown left.
// It covers only what a node makes (other test packages run clusters at
// the same time), so it lists the node's processes, not all.
type hostState struct {
	procs, mounts, cgroups, links, routes, netns []string
	nft, iptables                                string
	sysctls                                      map[string]string
	paths                                        map[string][]string // host path -> entries; absent: did not exist
}

// nodePrograms are the programs a real node runs.
var nodePrograms = []string{binKubelet, binKubeProxy, binContainerd, binShim, binRunc, binCoreDNS, "bindfs"}

func readHostState() hostState {
	h := hostState{sysctls: map[string]string{}}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if (err == nil && slices.Contains(nodePrograms, filepath.Base(exe))) || strings.Contains(string(cg), "/"+nodeCgroupRoot) {
			h.procs = append(h.procs, fmt.Sprintf("pid %d %s", pid, exe))
		}
	}
	for _, m := range mountinfo() {
		if nodeMount(m.point) || m.point == "/run/netns" || m.point == "/run/netns/"+nodeNetns || strings.HasPrefix(m.fstype, "fuse.bindfs") {
			h.mounts = append(h.mounts, m.point+" ("+m.fstype+")")
		}
	}
	for _, mnt := range cgroupMountpoints() {
		if _, err := os.Stat(filepath.Join(mnt, nodeCgroupRoot)); err == nil {
			h.cgroups = append(h.cgroups, filepath.Join(mnt, nodeCgroupRoot))
		}
	}
	lines := func(name string, args ...string) []string {
		out, _ := exec.Command(name, args...).Output()
		var l []string
		for s := range strings.Lines(string(out)) {
			if s = strings.TrimSpace(s); s != "" {
				l = append(l, s)
			}
		}
		return l
	}
	for _, l := range lines("ip", "-o", "link", "show") {
		// "3: name@if2: <...>": the name only (counters and flags change).
		f := strings.Fields(l)
		if len(f) > 1 {
			h.links = append(h.links, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	h.routes = lines("ip", "route", "show", "table", "all")
	h.netns = lines("ip", "netns", "list")
	out, _ := exec.Command("nft", "list", "ruleset").Output()
	h.nft = string(out)
	for _, l := range lines("iptables-save") {
		if !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, ":") {
			h.iptables += l + "\n"
		}
	}
	for _, s := range kernelSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			h.sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	h.paths = hostPathEntries()
	return h
}

// hostPathEntries maps each of hostPaths that exists to the names in it
// (none for a file).
func hostPathEntries() map[string][]string {
	out := map[string][]string{}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		names := []string{}
		es, _ := os.ReadDir(p)
		for _, e := range es {
			names = append(names, e.Name())
		}
		out[p] = names
	}
	return out
}

// diff lists what after has that h (the state before) had not.
func (h hostState) diff(after hostState) []string {
	var out []string
	added := func(kind string, before, now []string) {
		for _, x := range now {
			if !slices.Contains(before, x) {
				out = append(out, kind+" "+x)
			}
		}
	}
	added("process", h.procs, after.procs)
	added("mount", h.mounts, after.mounts)
	added("cgroup", h.cgroups, after.cgroups)
	added("link", h.links, after.links)
	added("route", h.routes, after.routes)
	added("network namespace", h.netns, after.netns)
	if h.nft != after.nft {
		out = append(out, "nftables ruleset changed:\n"+after.nft)
	}
	if h.iptables != after.iptables {
		out = append(out, "iptables rules changed:\n"+after.iptables)
	}
	for k, v := range h.sysctls {
		if after.sysctls[k] != v {
			out = append(out, fmt.Sprintf("sysctl %s is %s, was %s", k, after.sysctls[k], v))
		}
	}
	for p, now := range after.paths {
		before, had := h.paths[p]
		if !had {
			out = append(out, "path "+p)
			continue
		}
		for _, e := range now {
			if !slices.Contains(before, e) {
				out = append(out, "path "+filepath.Join(p, e))
			}
		}
	}
	return out
}
