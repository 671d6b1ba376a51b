package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGitignoreIgnoresSymlinkedDirs guards against a worktree that reads
// as modified because it shares .tools (or .cache) with another through a
// symlink: a "/.tools/" pattern matches only a directory. make images
// labels its images with git describe --dirty, and git status should not
// cry wolf either.
func TestGitignoreIgnoresSymlinkedDirs(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	ignore, err := os.ReadFile(filepath.Join("..", "..", ".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	shared := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	git("init", "-q")
	if err := os.WriteFile(filepath.Join(repo, ".gitignore"), ignore, 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", ".gitignore")
	for _, name := range []string{".tools", ".cache", "bin", ".talkide"} {
		if err := os.Symlink(shared, filepath.Join(repo, name)); err != nil {
			t.Fatal(err)
		}
	}
	if st := git("status", "--porcelain", "--untracked-files=all"); strings.Contains(st, "??") {
		t.Errorf("with .tools, .cache, bin and .talkide symlinks, git status shows untracked files:\n%s", st)
	}
}
