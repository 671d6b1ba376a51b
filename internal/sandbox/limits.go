package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	// config with transcripts, tmp) take on disk, in allocated bytes. It is
	// checked every DiskCheckEvery while the agent runs: over it the
	// running turn is stopped. A single file can never grow past it (the
	// kernel refuses the write: RLIMIT_FSIZE) [TALKIDE_AGENT_DISK].
	// Default 10 GiB.
	DiskBytes int64
}

// DefaultLimits are the limits of a conversation whose settings are zero.
var DefaultLimits = Limits{MemoryBytes: 2 << 30, Processes: 512, CPUWeight: 100, DiskBytes: 10 << 30}

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
	if l.Processes > 0 && l.Processes < 16 {
		return fmt.Errorf("agent process limit %d: want at least 16", l.Processes)
	}
	return nil
}

// DiskUsage returns the bytes allocated on disk to the files under dirs,
// counting each inode once (hard links) and following no symbolic link. A
// missing directory counts 0. Files vanishing during the walk are skipped.
func DiskUsage(dirs ...string) (int64, error) {
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	var total int64
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				if d != nil && d.IsDir() && p != dir {
					return fs.SkipDir // unreadable subdirectory: not countable, not fatal
				}
				return err
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			st, ok := info.Sys().(*syscall.Stat_t)
			if !ok {
				return nil
			}
			k := ino{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
			total += st.Blocks * 512
			return nil
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return total, err
		}
	}
	return total, nil
}

// DeletedOpenBytes returns the bytes allocated on disk to files that the
// processes pids hold open but that no directory names any more (deleted
// while open): space a walk of the directories does not see. Each inode
// counts once; a process or descriptor that vanishes is skipped.
func DeletedOpenBytes(pids []int) int64 {
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	var total int64
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			p := dir + "/" + e.Name()
			if target, err := os.Readlink(p); err != nil || !strings.HasSuffix(target, " (deleted)") {
				continue
			}
			var st syscall.Stat_t
			// stat through the descriptor's magic link: the open file itself.
			if err := syscall.Stat(p, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Nlink != 0 {
				continue
			}
			k := ino{uint64(st.Dev), st.Ino}
			if !seen[k] {
				seen[k] = true
				total += st.Blocks * 512
			}
		}
	}
	return total
}
