package agentfs

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// secret is the content of a file only root may read; no error may show it.
const secret = "leaked-first-bytes-of-a-root-only-file"

const agentUID = 200123

// agentTree builds an agent-owned directory holding every kind of thing an
// agent can put where the worker expects a file, and a root-only file
// outside it.
func agentTree(t *testing.T, asRoot bool) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "agent")
	outside = filepath.Join(base, "root-only")
	must(t, os.Mkdir(outside, 0o700))
	must(t, os.WriteFile(filepath.Join(outside, "key"), []byte(secret), 0o600))
	must(t, syscall.Mkfifo(filepath.Join(outside, "fifo"), 0o600))
	for _, d := range []string{"projects/p", "dir.jsonl", "real"} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o700))
	}
	write := func(name, content string) {
		must(t, os.WriteFile(filepath.Join(root, name), []byte(content), 0o600))
	}
	write("ok.json", `{"mcpServers":{}}`)
	write("projects/p/s.jsonl", `{"type":"assistant"}`+"\n")
	must(t, os.Symlink(filepath.Join(outside, "key"), filepath.Join(root, "link.json")))
	must(t, os.Symlink("ok.json", filepath.Join(root, "relative-link.json")))
	must(t, os.Symlink(outside, filepath.Join(root, "projects", "q")))                              // a middle component
	must(t, os.Symlink(filepath.Join(root, "projects", "p"), filepath.Join(root, "projects", "r"))) // inside, still refused
	must(t, os.Symlink(filepath.Join(outside, "fifo"), filepath.Join(root, "fifo-link.jsonl")))
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo.jsonl"), 0o600))
	must(t, os.Symlink("/dev/zero", filepath.Join(root, "zero.jsonl")))
	must(t, os.Symlink("/proc/self/root/etc/passwd", filepath.Join(root, "magic.jsonl")))
	must(t, os.Link(filepath.Join(outside, "key"), filepath.Join(root, "hardlink.json")))
	sparse, err := os.Create(filepath.Join(root, "sparse.jsonl"))
	must(t, err)
	must(t, sparse.Truncate(10<<30)) // 10 GB, no blocks
	must(t, sparse.Close())
	ln, err := net.Listen("unix", filepath.Join(root, "sock"))
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	if asRoot {
		must(t, syscall.Mknod(filepath.Join(root, "null.jsonl"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		// Everything of the agent's is the agent's, as the CLI writes it.
		must(t, filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
			if err != nil || p == filepath.Join(root, "hardlink.json") {
				return err
			}
			return os.Lchown(p, agentUID, agentUID)
		}))
	}
	return root, outside
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestOpenRefusesWhatTheAgentCanPlant reads every variant through both
// resolvers (openat2 and the component walk) and wants each refused with
// the right error, at once, with no content in the error.
func TestOpenRefusesWhatTheAgentCanPlant(t *testing.T) {
	asRoot := os.Geteuid() == 0
	uid := os.Geteuid()
	if asRoot {
		uid = agentUID
	}
	root, outside := agentTree(t, asRoot)
	cases := []struct {
		name     string
		path     string
		want     error // nil: read succeeds
		needRoot bool
	}{
		{"regular file", "ok.json", nil, false},
		{"file in a subdirectory", "projects/p/s.jsonl", nil, false},
		{"symlink to a root-only file", "link.json", ErrSymlink, false},
		{"symlink to a file inside", "relative-link.json", ErrSymlink, false},
		{"symlink in a middle component, pointing outside", "projects/q/key", ErrSymlink, false},
		{"symlink in a middle component, pointing inside", "projects/r/s.jsonl", ErrSymlink, false},
		{"symlink to a FIFO", "fifo-link.jsonl", ErrSymlink, false},
		{"FIFO", "fifo.jsonl", ErrNotRegular, false},
		{"symlink to /dev/zero", "zero.jsonl", ErrSymlink, false},
		{"symlink through a magic link", "magic.jsonl", ErrSymlink, false},
		{"device node", "null.jsonl", ErrNotRegular, true},
		{"socket", "sock", ErrNotRegular, false},
		{"directory where a file is expected", "dir.jsonl", ErrNotRegular, false},
		{"file where a directory is expected", "ok.json/x", ErrNotDir, false},
		{"hard link to a root-only file", "hardlink.json", ErrOwner, true},
		{"10 GB sparse file", "sparse.jsonl", ErrTooLarge, false},
		{"dot-dot", "../root-only/key", ErrEscape, false},
		{"dot-dot inside", "projects/../ok.json", ErrEscape, false},
		{"absolute", "/etc/passwd", ErrEscape, false},
		{"empty", "", ErrEscape, false},
		{"missing", "nope.json", fs.ErrNotExist, false},
	}
	for _, mode := range []string{"openat2", "walk"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "openat2" && !haveOpenat2() {
				t.Skip("this kernel has no openat2; the walk is what runs")
			}
			d, err := OpenRoot(root)
			must(t, err)
			defer d.Close()
			d.walk = mode == "walk"
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					if c.needRoot && !asRoot {
						t.Skip("needs root (the variant needs mknod or chown)")
					}
					var before runtime.MemStats
					runtime.ReadMemStats(&before)
					start := time.Now()
					b, err := d.ReadFile(c.path, Limits{MaxBytes: 1 << 20, UID: uid})
					if el := time.Since(start); el > 2*time.Second {
						t.Errorf("took %s, want no wait", el)
					}
					var after runtime.MemStats
					runtime.ReadMemStats(&after)
					if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
						t.Errorf("allocated %d bytes, want the read bounded", grew)
					}
					if c.want == nil {
						if err != nil {
							t.Fatalf("got %v, want the file read", err)
						}
						if len(b) == 0 {
							t.Fatal("got nothing")
						}
						return
					}
					if !errors.Is(err, c.want) {
						t.Fatalf("got %v (%s), want %v", err, Category(err), c.want)
					}
					if b != nil {
						t.Errorf("got %d bytes with the error", len(b))
					}
					if msg := err.Error(); strings.Contains(msg, secret[:8]) || strings.Contains(msg, outside) || strings.Contains(msg, "/dev/") {
						t.Errorf("error shows content or a link target: %s", msg)
					}
					if Category(err) == "io" {
						t.Errorf("error %v has no category", err)
					}
				})
			}
		})
	}
}

// TestDirectoriesAreNotFollowed checks OpenDir and Names on the same
// variants.
func TestDirectoriesAreNotFollowed(t *testing.T) {
	root, _ := agentTree(t, os.Geteuid() == 0)
	for _, mode := range []string{"openat2", "walk"} {
		t.Run(mode, func(t *testing.T) {
			d, err := OpenRoot(root)
			must(t, err)
			defer d.Close()
			d.walk = mode == "walk"
			for name, want := range map[string]error{
				"projects/q": ErrSymlink, "projects/r": ErrSymlink, "link.json": ErrSymlink,
				"ok.json": ErrNotDir, "fifo.jsonl": ErrNotDir, "..": ErrEscape,
			} {
				if sub, err := d.OpenDir(name); !errors.Is(err, want) {
					if sub != nil {
						sub.Close()
					}
					t.Errorf("OpenDir(%s): got %v, want %v", name, err, want)
				}
			}
			p, err := d.OpenDir("projects")
			must(t, err)
			defer p.Close()
			names, err := p.Names(10)
			must(t, err)
			if len(names) != 3 {
				t.Errorf("got %v, want p, q and r", names)
			}
			if _, err := p.Names(2); !errors.Is(err, ErrTooMany) {
				t.Errorf("Names(2): got %v, want ErrTooMany", err)
			}
		})
	}
	// A root is the operator's path: a link there is the operator's.
	d, err := OpenRoot(filepath.Join(root, "projects", "q"))
	must(t, err)
	d.Close()
}

// TestRemoveFollowsNoComponent: a symlink in the middle of the path refuses
// the removal; as the last component it is removed itself.
func TestRemoveFollowsNoComponent(t *testing.T) {
	root, outside := agentTree(t, os.Geteuid() == 0)
	d, err := OpenRoot(root)
	must(t, err)
	defer d.Close()
	if err := d.Remove("projects/q/key"); !errors.Is(err, ErrSymlink) {
		t.Errorf("got %v, want ErrSymlink", err)
	}
	must(t, d.Remove("link.json"))
	if _, err := os.Stat(filepath.Join(outside, "key")); err != nil {
		t.Fatalf("the link's target went: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "link.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the link is still there: %v", err)
	}
}

// TestChownTreeStaysInTheTree gives a tree to the agent and checks that
// nothing outside changed owner: not a symlink's target, not a hard link's
// other name, not a directory swapped for a link.
func TestChownTreeStaysInTheTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to change owners")
	}
	base := t.TempDir()
	top := filepath.Join(base, "ws")
	outside := filepath.Join(base, "etc")
	must(t, os.MkdirAll(filepath.Join(top, "a", "b"), 0o700))
	must(t, os.Mkdir(outside, 0o700))
	must(t, os.WriteFile(filepath.Join(outside, "shadow"), []byte(secret), 0o600))
	must(t, os.WriteFile(filepath.Join(top, "a", "b", "f"), nil, 0o600))
	must(t, os.Symlink(outside, filepath.Join(top, "a", "etc")))
	must(t, os.Symlink(filepath.Join(outside, "shadow"), filepath.Join(top, "shadow-link")))
	must(t, os.Link(filepath.Join(outside, "shadow"), filepath.Join(top, "shadow-hardlink")))
	must(t, syscall.Mkfifo(filepath.Join(top, "fifo"), 0o600))

	must(t, ChownTree(top, agentUID, agentUID))
	owner := func(p string) uint32 {
		fi, err := os.Lstat(p)
		must(t, err)
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	for _, p := range []string{"", "a", "a/b", "a/b/f", "a/etc", "shadow-link", "fifo"} {
		if got := owner(filepath.Join(top, p)); got != agentUID {
			t.Errorf("%s: owner %d, want %d", p, got, agentUID)
		}
	}
	for _, p := range []string{outside, filepath.Join(outside, "shadow")} {
		if got := owner(p); got != 0 {
			t.Errorf("%s outside the tree: owner %d, want 0", p, got)
		}
	}
	// Owned already: nothing is walked.
	must(t, os.Lchown(filepath.Join(top, "a", "b", "f"), 0, 0))
	must(t, ChownTree(top, agentUID, agentUID))
	if got := owner(filepath.Join(top, "a", "b", "f")); got != 0 {
		t.Errorf("a tree the agent owns was walked again")
	}
	// A top that is a symlink is refused.
	must(t, os.Symlink(outside, filepath.Join(base, "ws-link")))
	if err := ChownTree(filepath.Join(base, "ws-link"), agentUID, agentUID); !errors.Is(err, ErrSymlink) {
		t.Errorf("got %v, want ErrSymlink", err)
	}
}

// TestChownDirRefusesASymlink: the directory itself, never a link's target.
func TestChownDirRefusesASymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to change owners")
	}
	base := t.TempDir()
	must(t, os.Mkdir(filepath.Join(base, "etc"), 0o700))
	must(t, os.Symlink(filepath.Join(base, "etc"), filepath.Join(base, "tmp")))
	if err := ChownDir(filepath.Join(base, "tmp"), agentUID, agentUID); !errors.Is(err, ErrSymlink) {
		t.Errorf("got %v, want ErrSymlink", err)
	}
	fi, err := os.Stat(filepath.Join(base, "etc"))
	must(t, err)
	if fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("the link's target changed owner")
	}
	must(t, os.Mkdir(filepath.Join(base, "real"), 0o700))
	must(t, ChownDir(filepath.Join(base, "real"), agentUID, agentUID))
}
