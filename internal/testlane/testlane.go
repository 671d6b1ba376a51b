// Package testlane tells the fast lane from the whole suite. `make check`
// runs `go test -short ./...`: every test that needs no test cluster, no
// real Claude Code CLI, no browser and none of the tools `make test` builds
// or installs first (Helm, the node's Debian packages), in about two
// minutes. `make test`
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

// NeedsHelm marks a test that runs the Helm binaries `make helm` builds.
func NeedsHelm(t testing.TB) { t.Helper(); skip(t, "Helm (make helm)") }

// NeedsNodeTools marks a test that needs the Debian packages `make
// node-tools` installs (bindfs and FUSE, iptables, busybox).
func NeedsNodeTools(t testing.TB) { t.Helper(); skip(t, "the node's tools (make node-tools)") }

func skip(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: make test runs it; make check (go test -short) does not", what)
	}
}
