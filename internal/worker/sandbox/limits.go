package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Limits bound one conversation's agent: its CLI and everything it starts.
// A zero field takes its default (DefaultLimits); a negative one means no
// limit.
type Limits struct {
	// MemoryBytes caps the memory (RSS, page cache and kernel memory) of
	// all the agent's processes together; over it the kernel's OOM killer
	// ends the largest of them [TALKIDE_AGENT_MEMORY]. Default 2 GiB: the CLI
	// alone uses 200-400 MB.
	MemoryBytes int64
	// Processes caps the agent's processes and threads together; a fork
	// beyond it fails with EAGAIN [TALKIDE_AGENT_PROCESSES]. Default 512.
	Processes int64
	// CPUWeight is the agent's share of the CPU against other
	// conversations' agents, 1-10000, 100 being an equal share
	// [TALKIDE_AGENT_CPU_WEIGHT]. Default 100.
	CPUWeight uint64
	// DiskBytes caps what the conversation's directories (workspace, home,
	// config with transcripts, tmp) take on disk, in allocated bytes
	// (MeasureDisk). The worker measures it while the agent runs: over it
	// the running turn is stopped, and a turn that starts over it may only
	// free space. A single file can never grow past it (the kernel refuses
	// the write: RLIMIT_FSIZE), and nothing can reserve space without
	// writing it (the jail refuses fallocate) [TALKIDE_AGENT_DISK].
	// Default 10 GiB.
	DiskBytes int64
	// DiskFiles caps the files, directories and other entries of those
	// directories together, each name counted, a hard link too (a
	// million empty files take the filesystem's inodes, not its bytes) [TALKIDE_AGENT_FILES]. Default
	// 500,000.
	DiskFiles int64
}

// DefaultLimits are the limits of a conversation whose settings are zero.
var DefaultLimits = Limits{MemoryBytes: 2 << 30, Processes: 512, CPUWeight: 100, DiskBytes: 10 << 30, DiskFiles: 500000}

// WithDefaults returns l with zero fields set from DefaultLimits and
// negative ones set to 0 (no limit).
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits
	pick := func(v, def int64) int64 {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	l.MemoryBytes = pick(l.MemoryBytes, d.MemoryBytes)
	l.Processes = pick(l.Processes, d.Processes)
	l.DiskBytes = pick(l.DiskBytes, d.DiskBytes)
	l.DiskFiles = pick(l.DiskFiles, d.DiskFiles)
	if l.CPUWeight == 0 {
		l.CPUWeight = d.CPUWeight
	}
	return l
}

// Validate reports a limit out of range.
func (l Limits) Validate() error {
	if l.CPUWeight > 10000 {
		return fmt.Errorf("agent CPU weight %d: want 1-10000", l.CPUWeight)
	}
	if l.MemoryBytes > 0 && l.MemoryBytes < 64<<20 {
		return fmt.Errorf("agent memory limit %d bytes: want at least 64 MiB (the CLI alone needs hundreds)", l.MemoryBytes)
	}
	if l.DiskFiles > 0 && l.DiskFiles < 1000 {
		return fmt.Errorf("agent file limit %d: want at least 1000 (the CLI's own files take hundreds)", l.DiskFiles)
	}
	if l.Processes > 0 && l.Processes < 16 {
		return fmt.Errorf("agent process limit %d: want at least 16", l.Processes)
	}
	return nil
}

// DeletedOpenBytes returns the bytes allocated on disk to files that the
// processes pids hold open or mapped but that no directory names any more
// (deleted while open): space a walk of the directories does not see. It
// looks at every file table of a process's threads (a thread group whose
// leader exited keeps its files in its other threads; a thread may have
// unshared its table) and at the processes' mapped files
// (/proc/<pid>/map_files: a file mapped, closed and deleted; reading it
// needs CAP_SYS_ADMIN, which a pod's worker lacks). Each inode counts once;
// a process or descriptor that vanishes is skipped. Not seen: a descriptor
// in flight in a unix socket (sent and closed).
//
// It runs at every disk walk of every busy agent, so it reads what it
// can in one go: a thread's descriptors only when kcmp(2) does not show
// it sharing the process's table, and of the mappings only those that
// /proc/<pid>/maps marks deleted.
func DeletedOpenBytes(pids []int) int64 {
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	var total int64
	add := func(p string) {
		var st syscall.Stat_t
		// stat through the magic link: the open (or mapped) file itself.
		if err := syscall.Stat(p, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Nlink != 0 {
			return
		}
		k := ino{uint64(st.Dev), st.Ino}
		if !seen[k] {
			seen[k] = true
			total += st.Blocks * 512
		}
	}
	addFds := func(dir string) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			p := dir + "/" + e.Name()
			if target, err := os.Readlink(p); err == nil && strings.HasSuffix(target, " (deleted)") {
				add(p)
			}
		}
	}
	for _, pid := range pids {
		base := "/proc/" + strconv.Itoa(pid)
		addFds(base + "/fd")
		var threads []string
		tasks, _ := os.ReadDir(base + "/task")
		for _, t := range tasks {
			if tid, err := strconv.Atoi(t.Name()); err == nil && tid != pid {
				threads = append(threads, t.Name())
				if !sharesFileTable(pid, tid) {
					addFds(base + "/task/" + t.Name() + "/fd")
				}
			}
		}
		// The threads share one memory map; when the group's leader has
		// exited, its maps is empty and a live thread's holds it.
		ranges, mapped := deletedMappings(base)
		for i := 0; !mapped && i < len(threads); i++ {
			if ranges, mapped = deletedMappings("/proc/" + threads[i]); mapped {
				base = "/proc/" + threads[i]
			}
		}
		for _, r := range ranges {
			add(base + "/map_files/" + r)
		}
	}
	return total
}

// kcmpFiles is KCMP_FILES of kcmp(2): do two tasks share a file table.
const kcmpFiles = 2

// sharesFileTable reports whether thread tid of process pid uses the
// process's file table; false when kcmp(2) cannot tell (a kernel without
// it, a seccomp profile refusing it, a task gone).
func sharesFileTable(pid, tid int) bool {
	r, _, errno := syscall.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(tid), kcmpFiles, 0, 0, 0)
	return errno == 0 && r == 0
}

// deletedMappings returns the map_files names ("start-end", in hex) of
// the mappings that the maps file of the process or thread at /proc path
// proc marks deleted, and whether it showed any mapping (an exited
// thread-group leader shows none). A path is printed with its newlines
// escaped, so each line is one mapping; a file merely named "...
// (deleted)" is passed over by the caller (it has a link).
func deletedMappings(proc string) (names []string, mapped bool) {
	b, err := os.ReadFile(proc + "/maps")
	if err != nil {
		return nil, false
	}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSuffix(line, "\n")
		if !strings.HasSuffix(line, " (deleted)") {
			continue
		}
		rng, _, _ := strings.Cut(line, " ")
		lo, hi, ok := strings.Cut(rng, "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		// maps pads addresses to 8 digits; map_files does not.
		names = append(names, strconv.FormatUint(start, 16)+"-"+strconv.FormatUint(end, 16))
	}
	return names, len(b) > 0
}
