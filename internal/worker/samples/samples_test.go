package samples_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/talkide/talkide/internal/worker/samples"
)

func TestNames(t *testing.T) {
	if got := samples.Names(); !slices.Contains(got, "java-calculator") {
		t.Fatalf("Names() = %v, want java-calculator among them", got)
	}
	if _, err := samples.FS("nope"); !errors.Is(err, samples.ErrUnknown) {
		t.Fatalf("FS(nope): %v, want ErrUnknown", err)
	}
}

// The copy is complete, byte for byte, and every entry, the top included,
// belongs to the given user.
func TestCopyGivesTheTreeToItsOwner(t *testing.T) {
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 299970, 299970
	}
	dst := filepath.Join(t.TempDir(), "conv")
	if err := samples.Copy("java-calculator", dst, uid, gid); err != nil {
		t.Fatal(err)
	}
	src, _ := samples.FS("java-calculator")
	n := 0
	err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		st, err := os.Lstat(filepath.Join(dst, p))
		if err != nil {
			return err
		}
		sys := st.Sys().(*syscall.Stat_t)
		if int(sys.Uid) != uid || int(sys.Gid) != gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", p, sys.Uid, sys.Gid, uid, gid)
		}
		if d.IsDir() {
			return nil
		}
		want, _ := fs.ReadFile(src, p)
		got, err := os.ReadFile(filepath.Join(dst, p))
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: copied %d bytes (%v), want %d", p, len(got), err, len(want))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"build.gradle", "src/test/java/com/acme/CalculatorTest.java", ".gitignore"} {
		if _, err := os.Stat(filepath.Join(dst, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o700 {
		t.Errorf("top mode %v, want 0700", st.Mode().Perm())
	}
	t.Logf("%d entries copied", n)
}

// The destination must be fresh: an existing directory, or a symbolic link
// put there (to somewhere the agent wants root to write), is refused and
// left as it was.
func TestCopyRefusesAnExistingDestination(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "elsewhere")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "conv-link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{target, link} {
		if err := samples.Copy("java-calculator", dst, -1, -1); !errors.Is(err, fs.ErrExist) {
			t.Errorf("Copy to %s: %v, want fs.ErrExist", dst, err)
		}
	}
	if entries, _ := os.ReadDir(target); len(entries) != 0 {
		t.Errorf("the existing directory got %d entries", len(entries))
	}
	if err := samples.Copy("nope", filepath.Join(dir, "x"), -1, -1); !errors.Is(err, samples.ErrUnknown) {
		t.Errorf("Copy(nope): %v, want ErrUnknown", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Copy(nope) left %s: %v", filepath.Join(dir, "x"), err)
	}
}
