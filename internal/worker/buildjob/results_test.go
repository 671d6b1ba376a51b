package buildjob

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/talkide/talkide/internal/worker/agentfs"
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

// A build cannot have the worker parse more than MaxReportTotal of
// reports, nor one report many times through hard links of it (case from
// the review of issue 14: 64 links of one large report grew the worker's
// heap by 900 MiB).
func TestReadResultsBoundsWhatABuildMakesTheWorkerRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (as make test runs): files of the agent's uid")
	}
	const agent = 20001
	ws := t.TempDir()
	conv := "c_bounds"
	dir := filepath.Join(ws, conv, ReportsDir, "test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile("testdata/TEST-com.acme.CalculatorTest.xml")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "TEST-a.xml")
	if err := os.WriteFile(p, report, 0o644); err != nil || os.Chown(p, agent, agent) != nil {
		t.Fatal(err)
	}
	if err := os.Link(p, filepath.Join(dir, "TEST-b.xml")); err != nil {
		t.Fatal(err)
	}
	r, skipped, err := ReadResults(ws, conv, agent)
	if err != nil || r.Tests != 0 || len(skipped) != 2 || !strings.Contains(skipped[0], "hard-linked") {
		t.Errorf("hard-linked reports: %d tests, skipped %q, %v; want both refused", r.Tests, skipped, err)
	}

	// Reports over the total: padded to 15 MiB each, five of them.
	conv = "c_total"
	dir = filepath.Join(ws, conv, ReportsDir, "test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	padded := append(append([]byte{}, report...), []byte("<!--"+strings.Repeat("x", 15<<20-len(report)-8)+"-->")...)
	for i := range 5 {
		p := filepath.Join(dir, fmt.Sprintf("TEST-%d.xml", i))
		if err := os.WriteFile(p, padded, 0o644); err != nil || os.Chown(p, agent, agent) != nil {
			t.Fatal(err)
		}
	}
	r, skipped, err = ReadResults(ws, conv, agent)
	if err != nil || r.Tests != 4*4 || len(skipped) != 1 || !strings.Contains(skipped[0], "TEST-4.xml and further reports: over 64 MiB") {
		t.Errorf("over the total: %d tests, skipped %q, %v; want 4 reports read and the fifth refused", r.Tests, skipped, err)
	}
}
