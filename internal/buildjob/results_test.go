package buildjob

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/talkide/talkide/internal/agentfs"
)

// A build's reports are read from the files it wrote in the agent's tree,
// and nothing the agent put there in their place is followed or read: a
// symlinked reports directory, a symlink, a FIFO or another user's file
// named like a report. What is skipped is said, with why.
func TestReadResultsFromTheAgentsTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (as make test runs): files of two owners")
	}
	const agent = 20001
	ws := t.TempDir()
	conv := "c_results"
	reports := filepath.Join(ws, conv, ReportsDir)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(reports, "test"), 0o755))
	report, err := os.ReadFile("testdata/TEST-com.acme.CalculatorTest.xml")
	must(err)
	write := func(name string, b []byte, uid int) {
		p := filepath.Join(reports, "test", name)
		must(os.WriteFile(p, b, 0o644))
		must(os.Chown(p, uid, uid))
	}
	write("TEST-com.acme.CalculatorTest.xml", report, agent)
	write("TEST-com.acme.Broken.xml", []byte("<html>"), agent)
	write("TEST-com.acme.Roots.xml", report, 0) // not the agent's: a hard link to another's file looks so
	write("notes.txt", []byte("x"), agent)
	must(os.WriteFile(filepath.Join(ws, "secret.xml"), report, 0o600))
	must(os.Symlink(filepath.Join(ws, "secret.xml"), filepath.Join(reports, "test", "TEST-com.acme.Link.xml")))
	must(syscall.Mkfifo(filepath.Join(reports, "test", "TEST-com.acme.Fifo.xml"), 0o644))

	r, skipped, err := ReadResults(ws, conv, agent)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tests != 4 || r.Failures != 1 || len(r.Suites) != 1 {
		t.Errorf("results %+v; want the one real report", r)
	}
	slices.Sort(skipped)
	want := []string{"test/TEST-com.acme.Broken.xml: not a JUnit report", "test/TEST-com.acme.Fifo.xml: not_regular",
		"test/TEST-com.acme.Link.xml: symlink", "test/TEST-com.acme.Roots.xml: owner"}
	if !slices.Equal(skipped, want) {
		t.Errorf("skipped %q\nwant    %q", skipped, want)
	}

	// The reports directory itself replaced by a link to elsewhere.
	conv2 := "c_linked"
	must(os.MkdirAll(filepath.Join(ws, conv2, "build"), 0o755))
	must(os.Symlink(reports, filepath.Join(ws, conv2, ReportsDir)))
	if _, _, err := ReadResults(ws, conv2, agent); agentfs.Category(err) != "symlink" {
		t.Errorf("a linked reports directory: %v; want it refused as a symlink", err)
	}
	if _, _, err := ReadResults(ws, "c_none", agent); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no reports: %v; want not exist", err)
	}
	if _, _, err := ReadResults(ws, "../etc", agent); err == nil {
		t.Error("a conversation id with a path was accepted")
	}
}
