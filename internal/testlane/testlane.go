// Package testlane tells the fast lane from the whole suite. `make check`
// runs `go test -short ./...`: every test that needs no test cluster, no
// real Claude Code CLI and no browser, in about two minutes. `make test`
// (what CI runs) runs them all, with the race detector.
//
// A test that needs one of those calls the matching function first (the
// shared helpers do it for their callers: kubetest.Shared and SharedNode,
// platformtest.Start and ClaudeBin, the harness's rig); in the fast lane it
// is skipped with a line that says what it needs and where it runs. Outside
// the fast lane the functions do nothing: nothing is ever skipped by
// `make test`.
package testlane

import "testing"

// NeedsCLI marks a test that runs the real Claude Code CLI.
func NeedsCLI(t testing.TB) { t.Helper(); skip(t, "the real Claude Code CLI") }

// NeedsCluster marks a test that runs against the test cluster.
func NeedsCluster(t testing.TB) { t.Helper(); skip(t, "the test cluster") }

func skip(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: make test runs it; make check (go test -short) does not", what)
	}
}
