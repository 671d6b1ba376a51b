package sandbox_test

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/talkide/talkide/internal/worker/sandbox"
)

// deepTree makes under dir a chain of depth directories d/d/d/…, by
// descriptors (the path is far beyond PATH_MAX), holding at most two open;
// at level linkAt it puts, beside the next d, a file and a symbolic link
// to outside. It returns the top of the chain.
func deepTree(t *testing.T, dir string, depth, linkAt int, outside string) string {
	t.Helper()
	top := filepath.Join(dir, "d")
	if err := os.Mkdir(top, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(top, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < depth; i++ {
		if i == linkAt {
			if err := unix.Symlinkat(outside, fd, "out"); err != nil {
				t.Fatal(err)
			}
			f, err := unix.Openat(fd, "file", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(f)
		}
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatalf("level %d: %v", i, err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("level %d: %v", i, err)
		}
		unix.Close(fd)
		fd = next
	}
	unix.Close(fd)
	return top
}

// TestRemoveTreeDeep: a tree 25,000 levels deep, with a symbolic link to
// outside deep inside, is removed completely with an open-files limit of
// 256 (os.RemoveAll needs a descriptor per level); the link's target and
// its contents survive.
func TestRemoveTreeDeep(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(outside, "keep")
	if err := os.WriteFile(keep, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	const depth = 25000
	deepTree(t, root, depth, depth-10, outside)
	// A link at the top too, and one more to a file.
	if err := os.Symlink(outside, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(keep, filepath.Join(root, "keeplink")); err != nil {
		t.Fatal(err)
	}

	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	err := sandbox.RemoveTree(root)
	if rerr := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("RemoveTree: %v", err)
	}
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", root, err)
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "precious" {
		t.Errorf("the link's target: %q, %v; want it untouched", b, err)
	}
	if ents, _ := os.ReadDir(base); len(ents) != 1 {
		t.Errorf("left in %s: %v; want only outside", base, ents)
	}
}

// TestRemoveTreeLinkAndMissing: a dir that is a symbolic link is removed
// itself, its target kept; a missing one is no error.
func TestRemoveTreeLinkAndMissing(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := sandbox.RemoveTree(link); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(link); !os.IsNotExist(err) {
		t.Errorf("link still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, "f")); err != nil {
		t.Errorf("the link's target: %v", err)
	}
	if err := sandbox.RemoveTree(filepath.Join(base, "missing")); err != nil {
		t.Errorf("missing dir: %v", err)
	}
	// A wide, shallow tree: many entries per directory.
	wide := filepath.Join(base, "wide")
	for i := range 3000 {
		d := filepath.Join(wide, "a", "b"+string(rune('a'+i%26)), "c")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "f"+strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := sandbox.RemoveTree(wide); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(wide); !os.IsNotExist(err) {
		t.Errorf("wide tree still there: %v", err)
	}
}
