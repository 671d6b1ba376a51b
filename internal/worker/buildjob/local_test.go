package buildjob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/worker/buildjob"
	"github.com/talkide/talkide/internal/worker/samples"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// The local runner's tests run the real Gradle on the bundled sample
// project: Debian's gradle and junit4, which `make tools` installs (as
// root). Missing, they fail with what to install; they never skip. The
// jailed variants need root, as every jail test.

// localAgentUID is the build's user when the tests run as root.
const localAgentUID = 299960

// localSetup makes a workspace root and a temp root the build's user can
// pass through, and returns them with that user: an agent uid of its own
// when the tests run as root, else the test's own.
func localSetup(t *testing.T) (ws, tmpRoot string, uid int64) {
	t.Helper()
	base := t.TempDir()
	ws, tmpRoot = filepath.Join(base, "workspaces"), filepath.Join(base, "tmp")
	uid = int64(os.Getuid())
	if uid != 0 {
		for _, d := range []string{ws, tmpRoot} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		return ws, tmpRoot, uid
	}
	uid = localAgentUID
	u := sandbox.User{UID: uint32(uid), GID: uint32(uid)}
	for _, d := range []string{ws, tmpRoot} {
		if err := sandbox.MakeTraversable(filepath.Dir(base), d, u); err != nil {
			t.Fatal(err)
		}
	}
	return ws, tmpRoot, uid
}

// realGradle is Debian's gradle, or the test fails saying what to install.
func realGradle(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("gradle")
	if err != nil {
		t.Fatalf("%v", buildjob.ErrNoGradle)
	}
	for _, jar := range []string{"/usr/share/java/junit4.jar", "/usr/share/java/hamcrest-core.jar"} {
		if _, err := os.Stat(jar); err != nil {
			t.Fatalf("%s: %v: the sample project needs Debian's junit4 package (`make tools` installs it, as root: apt-get install gradle junit4)", jar, err)
		}
	}
	return p
}

// sampleTree copies the sample project into <ws>/<conv>, owned by uid.
func sampleTree(t *testing.T, ws, conv string, uid int64) string {
	t.Helper()
	dst := filepath.Join(ws, conv)
	if err := samples.Copy("java-calculator", dst, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
	return dst
}

// emptyTree makes <ws>/<conv>, owned by uid.
func emptyTree(t *testing.T, ws, conv string, uid int64) string {
	t.Helper()
	dst := filepath.Join(ws, conv)
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dst, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
	return dst
}

// writeAs writes a file of uid into a working tree.
func writeAs(t *testing.T, path, data string, uid int64) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
}

// fakeGradle writes a stand-in for gradle, a shell script, where the
// build's user can run it.
func fakeGradle(t *testing.T, tmpRoot, script string) string {
	t.Helper()
	p := filepath.Join(tmpRoot, "fake-gradle")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func localRequest(conv string, uid int64) buildjob.Request {
	return buildjob.Request{Tenant: "acme", Env: "dev", Conversation: conv, ID: "toolu_1", RunAsUser: uid}
}

// lines collects a build's log lines.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (c *lines) add(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.l = append(c.l, s)
}

func (c *lines) has(sub string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(c.l, func(s string) bool { return strings.Contains(s, sub) })
}

func (c *lines) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.l, "\n")
}

// buildProcesses lists the live processes whose environment holds a
// Gradle home under tmpRoot: every process of a build, however it
// detached, unless it cleared its environment.
func buildProcesses(tmpRoot string) []string {
	marker := []byte("GRADLE_USER_HOME=" + tmpRoot + "/")
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, marker) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && strings.Contains(string(st), ") Z ") {
			continue // a zombie: dead, waiting for its parent
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out = append(out, e.Name()+": "+clip(strings.ReplaceAll(string(cmd), "\x00", " "), 100))
	}
	return out
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// noBuildProcesses fails t when a process of a build under tmpRoot is
// still alive a moment after Run returned.
func noBuildProcesses(t *testing.T, tmpRoot string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		left := buildProcesses(tmpRoot)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the build outlived it: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkSampleReport checks the report of `gradle test` on the sample: one
// test passes, the other fails on Calculator.power's bug.
func checkSampleReport(t *testing.T, rep buildjob.Report, log *lines) {
	t.Helper()
	if rep.Runner != "local" || rep.ExitCode == 0 || rep.ExitCode == -1 {
		t.Errorf("runner %q, exit code %d: want local and gradle's failure status", rep.Runner, rep.ExitCode)
	}
	if o := rep.Outcome; o.Phase != buildjob.PhaseFailed || o.Reason != "ExitCode" || !strings.Contains(o.Message, "exited with status") {
		t.Errorf("outcome %+v, want failed with reason ExitCode", o)
	}
	r := rep.Results
	if r.Tests != 2 || r.Failures != 1 || r.Errors != 0 || len(rep.Skipped) != 0 {
		t.Fatalf("results: %d tests, %d failures, %d errors, skipped %v; want 2, 1, 0, none\nlog:\n%s", r.Tests, r.Failures, r.Errors, rep.Skipped, log)
	}
	failed := r.Failed()
	if len(failed) != 1 || failed[0].Class != "com.acme.CalculatorTest" || failed[0].Name != "raisesToAPower" ||
		!strings.Contains(failed[0].Message, "expected:<8> but was:<4>") || !strings.Contains(failed[0].Detail, "CalculatorTest.java") {
		t.Errorf("failed cases %+v, want CalculatorTest.raisesToAPower with expected:<8> but was:<4>", failed)
	}
	for _, want := range []string{":compileJava", ":test", "2 tests completed, 1 failed", "BUILD FAILED"} {
		if !log.has(want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if len(rep.LogTail) == 0 || !slices.ContainsFunc(rep.LogTail, func(s string) bool { return strings.Contains(s, "BUILD FAILED") }) {
		t.Errorf("log tail %q lacks the build's end", rep.LogTail)
	}
}

// TestLocalRunnerSampleProject runs Gradle on the sample project as the
// agent's user: the failing test is named with its assertion, gradle's
// output streams line by line, and a later build that runs no tests
// reports none (an earlier build's reports are not passed off as its own).
// It logs how long the builds took.
func TestLocalRunnerSampleProject(t *testing.T) {
	ws, tmpRoot, uid := localSetup(t)
	gradle := realGradle(t)
	const conv = "c_sample"
	sampleTree(t, ws, conv, uid)
	lr := &buildjob.LocalRunner{Gradle: gradle, WorkspaceRoot: ws, TmpRoot: tmpRoot}
	if err := lr.Check(); err != nil {
		t.Fatal(err)
	}
	log := &lines{}
	var progress []buildjob.Progress
	rep, err := lr.Run(t.Context(), localRequest(conv, uid), buildjob.Spec{Tasks: []string{"test"}},
		buildjob.Hooks{Line: log.add, Progress: func(p buildjob.Progress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gradle test, cold (nothing compiled, a fresh Gradle home): %v", time.Duration(rep.DurationMS)*time.Millisecond)
	checkSampleReport(t, rep, log)
	if len(progress) != 1 || !progress[0].Started {
		t.Errorf("progress %+v, want one Started", progress)
	}
	noBuildProcesses(t, tmpRoot)
	if entries, _ := os.ReadDir(tmpRoot); len(entries) != 0 {
		t.Errorf("the build's Gradle home was left in %s", tmpRoot)
	}

	// No tests run: no results, though the last build's reports were there.
	rep, err = lr.Run(t.Context(), localRequest(conv, uid), buildjob.Spec{Tasks: []string{"compileJava"}}, buildjob.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome.Phase != buildjob.PhaseSucceeded || rep.ExitCode != 0 || rep.Results.Tests != 0 {
		t.Errorf("compileJava: outcome %+v, exit %d, %d tests; want succeeded, 0, none\n%s", rep.Outcome, rep.ExitCode, rep.Results.Tests, strings.Join(rep.LogTail, "\n"))
	}
	t.Logf("gradle compileJava, warm (up to date): %v", time.Duration(rep.DurationMS)*time.Millisecond)

	// The test filter: only the passing test runs, again though its task
	// was run before with the same inputs.
	rep, err = lr.Run(t.Context(), localRequest(conv, uid), buildjob.Spec{Tasks: []string{"test"}, Tests: "com.acme.CalculatorTest.addsTwoNumbers"}, buildjob.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome.Phase != buildjob.PhaseSucceeded || rep.Results.Tests != 1 || rep.Results.Failures != 0 {
		t.Errorf("filtered test: outcome %+v, %d tests, %d failures; want succeeded, 1, 0\n%s", rep.Outcome, rep.Results.Tests, rep.Results.Failures, strings.Join(rep.LogTail, "\n"))
	}
	t.Logf("gradle test --tests …, warm (compiled; the test runs): %v", time.Duration(rep.DurationMS)*time.Millisecond)
}

// slowTest is a test that starts a process of its own in a new session
// (out of the build's process group) and then runs until it is stopped.
const slowTest = `package com.acme;

import org.junit.Test;

public class SlowTest {
    @Test
    public void waits() throws Exception {
        new ProcessBuilder("setsid", "sleep", "987651").redirectErrorStream(true)
            .redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        Thread.sleep(600000);
    }
}
`

// cancelMidBuild starts `gradle test` with slowTest in the tree, cancels
// it once the test's detached process runs, and checks that the build is
// cancelled and no process of it survives.
func cancelMidBuild(t *testing.T, lr *buildjob.LocalRunner, tree, conv, tmpRoot string, uid int64) {
	t.Helper()
	writeAs(t, filepath.Join(tree, "src/test/java/com/acme/SlowTest.java"), slowTest, uid)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		rep buildjob.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := lr.Run(ctx, localRequest(conv, uid), buildjob.Spec{Tasks: []string{"test"}, Tests: "com.acme.SlowTest"}, buildjob.Hooks{})
		done <- result{rep, err}
	}()
	deadline := time.Now().Add(3 * time.Minute)
	for !slices.ContainsFunc(buildProcesses(tmpRoot), func(s string) bool { return strings.Contains(s, "sleep 987651") }) {
		select {
		case r := <-done:
			t.Fatalf("the build ended before the slow test ran: %+v, %v\n%s", r.rep.Outcome, r.err, strings.Join(r.rep.LogTail, "\n"))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow test never started")
		}
	}
	running := buildProcesses(tmpRoot)
	cancel()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if o := r.rep.Outcome; o.Phase != buildjob.PhaseCancelled || o.Reason != "Cancelled" || r.rep.ExitCode != -1 {
		t.Errorf("outcome %+v, exit code %d; want cancelled, -1", o, r.rep.ExitCode)
	}
	t.Logf("%d processes ran at the cancel: %v", len(running), running)
	noBuildProcesses(t, tmpRoot)
}

// TestLocalRunnerCancelEndsEveryProcess: cancelling a running build (the
// turn interrupted) ends gradle, its test JVM, and a process a test
// detached into a session of its own.
func TestLocalRunnerCancelEndsEveryProcess(t *testing.T) {
	ws, tmpRoot, uid := localSetup(t)
	const conv = "c_cancel"
	tree := sampleTree(t, ws, conv, uid)
	lr := &buildjob.LocalRunner{Gradle: realGradle(t), WorkspaceRoot: ws, TmpRoot: tmpRoot}
	cancelMidBuild(t, lr, tree, conv, tmpRoot, uid)
}

// TestLocalRunnerJailed runs the sample in a jail like the agent's, as an
// agent uid: same report, reports owned by the agent; a cancelled build
// leaves nothing running.
func TestLocalRunnerJailed(t *testing.T) {
	ws, tmpRoot, uid := localSetup(t)
	const conv = "c_jailed"
	tree := sampleTree(t, ws, conv, uid)
	lr := &buildjob.LocalRunner{Gradle: realGradle(t), WorkspaceRoot: ws, TmpRoot: tmpRoot,
		Jail: testJail(t, sandbox.Limits{})}
	log := &lines{}
	rep, err := lr.Run(t.Context(), localRequest(conv, uid), buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{Line: log.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gradle test in a jail, cold: %v", time.Duration(rep.DurationMS)*time.Millisecond)
	checkSampleReport(t, rep, log)
	noBuildProcesses(t, tmpRoot)
	cancelMidBuild(t, lr, tree, conv, tmpRoot, uid)
}

// TestLocalRunnerQueue: builds beyond MaxConcurrent wait and are told
// their place; so does a second build of a conversation whose build runs
// (they share a working tree), whatever MaxConcurrent is.
func TestLocalRunnerQueue(t *testing.T) {
	ws, tmpRoot, uid := localSetup(t)
	// Waits until the test puts "go" into the working tree.
	gradle := fakeGradle(t, tmpRoot, `echo "fake gradle $*"; while [ ! -e go ]; do sleep 0.05; done`)
	treeA, treeB := emptyTree(t, ws, "c_a", uid), emptyTree(t, ws, "c_b", uid)
	for _, tc := range []struct {
		name           string
		max            int
		second, unlock string // the second build's conversation; the tree whose "go" lets the first end
	}{
		{"machine limit", 1, "c_b", treeA},
		{"one conversation", 2, "c_a", treeA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, tr := range []string{treeA, treeB} {
				_ = os.Remove(filepath.Join(tr, "go"))
			}
			writeAs(t, filepath.Join(treeB, "go"), "", uid)
			lr := &buildjob.LocalRunner{Gradle: gradle, WorkspaceRoot: ws, TmpRoot: tmpRoot, MaxConcurrent: tc.max}
			started := make(chan struct{})
			first := make(chan buildjob.Report, 1)
			go func() {
				rep, err := lr.Run(t.Context(), localRequest("c_a", uid), buildjob.Spec{Tasks: []string{"build"}},
					buildjob.Hooks{Progress: func(p buildjob.Progress) {
						if p.Started {
							close(started)
						}
					}})
				if err != nil {
					t.Error(err)
				}
				first <- rep
			}()
			<-started
			queued := make(chan int, 8)
			second := make(chan buildjob.Report, 1)
			go func() {
				rep, err := lr.Run(t.Context(), localRequest(tc.second, uid), buildjob.Spec{Tasks: []string{"build"}},
					buildjob.Hooks{Progress: func(p buildjob.Progress) {
						if p.Queued > 0 {
							queued <- p.Queued
						}
					}})
				if err != nil {
					t.Error(err)
				}
				second <- rep
			}()
			select {
			case place := <-queued:
				if place != 1 {
					t.Fatalf("queued at place %d, want 1", place)
				}
			case rep := <-second:
				t.Fatalf("the second build ran beside the first: %+v", rep.Outcome)
			case <-time.After(30 * time.Second):
				t.Fatal("the second build was never queued")
			}
			writeAs(t, filepath.Join(tc.unlock, "go"), "", uid)
			for _, ch := range []chan buildjob.Report{first, second} {
				select {
				case rep := <-ch:
					if rep.Outcome.Phase != buildjob.PhaseSucceeded {
						t.Errorf("outcome %+v\n%s", rep.Outcome, strings.Join(rep.LogTail, "\n"))
					}
				case <-time.After(30 * time.Second):
					t.Fatal("a build never ended")
				}
			}
		})
	}
}

// TestLocalRunnerEnvironment: the build gets its own small environment,
// never the worker's (a variable of the worker does not reach it), runs
// as the agent's user in the working tree with the checked arguments, and
// its Gradle home is removed after it. A non-zero exit is a failed build.
func TestLocalRunnerEnvironment(t *testing.T) {
	t.Setenv("TALKIDE_SECRET", "s3cret-of-the-worker")
	ws, tmpRoot, uid := localSetup(t)
	gradle := fakeGradle(t, tmpRoot, `echo "args: $*"; echo "uid: $(id -u)"; echo "pwd: $(pwd)"; env | sed 's/^/env: /'; exit 3`)
	tree := emptyTree(t, ws, "c_env", uid)
	lr := &buildjob.LocalRunner{Gradle: gradle, WorkspaceRoot: ws, TmpRoot: tmpRoot}
	log := &lines{}
	rep, err := lr.Run(t.Context(), localRequest("c_env", uid), buildjob.Spec{Tasks: []string{"test"}, Tests: "com.acme.*Test"}, buildjob.Hooks{Line: log.add})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "TALKIDE_SECRET") || strings.Contains(log.String(), "s3cret") {
		t.Errorf("the worker's environment reached the build:\n%s", log)
	}
	for _, want := range []string{
		"args: --no-daemon --console=plain --offline test --tests com.acme.*Test",
		"uid: " + strconv.FormatInt(uid, 10), "pwd: " + tree,
		"env: PATH=/usr/local/bin:/usr/bin:/bin", "env: LANG=C.UTF-8", "env: GRADLE_USER_HOME=" + tmpRoot + "/talkide-gradle-",
		"env: HOME=" + tmpRoot + "/talkide-gradle-",
	} {
		if !log.has(want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	var names []string
	for _, l := range strings.Split(log.String(), "\n") {
		name, _, ok := strings.Cut(strings.TrimPrefix(l, "env: "), "=")
		// PWD, OLDPWD, SHLVL and _ are the shell's own.
		if ok && strings.HasPrefix(l, "env: ") && !slices.Contains([]string{"PWD", "OLDPWD", "SHLVL", "_"}, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if want := []string{"GRADLE_USER_HOME", "HOME", "LANG", "PATH"}; !slices.Equal(names, want) {
		t.Errorf("environment %v, want %v", names, want)
	}
	if rep.ExitCode != 3 || rep.Outcome.Phase != buildjob.PhaseFailed || rep.Outcome.Reason != "ExitCode" {
		t.Errorf("exit code %d, outcome %+v; want 3, failed with reason ExitCode", rep.ExitCode, rep.Outcome)
	}
	if entries, _ := os.ReadDir(tmpRoot); len(entries) != 1 {
		t.Errorf("the build's Gradle home was left in %s: %v", tmpRoot, entries)
	}
}

// TestLocalRunnerTimeout: a build past its Timeout is killed with what it
// started and fails with DeadlineExceeded.
func TestLocalRunnerTimeout(t *testing.T) {
	ws, tmpRoot, uid := localSetup(t)
	gradle := fakeGradle(t, tmpRoot, `setsid sleep 987652 & sleep 987653`)
	emptyTree(t, ws, "c_slow", uid)
	lr := &buildjob.LocalRunner{Gradle: gradle, WorkspaceRoot: ws, TmpRoot: tmpRoot, Timeout: time.Second}
	rep, err := lr.Run(t.Context(), localRequest("c_slow", uid), buildjob.Spec{Tasks: []string{"build"}}, buildjob.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if o := rep.Outcome; o.Phase != buildjob.PhaseFailed || o.Reason != "DeadlineExceeded" || rep.ExitCode != -1 {
		t.Errorf("outcome %+v, exit code %d; want failed with DeadlineExceeded, -1", o, rep.ExitCode)
	}
	noBuildProcesses(t, tmpRoot)
}

// TestLocalRunnerRefusals: what a request may not do is refused before
// anything runs: options as tasks or filter, root, a path as conversation,
// a working tree that is not the user's; and a machine without Gradle is
// told what to install.
func TestLocalRunnerRefusals(t *testing.T) {
	ws, tmpRoot, uid := localSetup(t)
	ran := filepath.Join(tmpRoot, "ran")
	gradle := fakeGradle(t, tmpRoot, `touch `+ran)
	emptyTree(t, ws, "c_ok", uid)
	lr := &buildjob.LocalRunner{Gradle: gradle, WorkspaceRoot: ws, TmpRoot: tmpRoot}
	req := localRequest("c_ok", uid)
	for name, tc := range map[string]struct {
		req  buildjob.Request
		spec buildjob.Spec
		want string
	}{
		"an init script as task":  {req, buildjob.Spec{Tasks: []string{"--init-script=x"}}, "gradle task"},
		"a property as task":      {req, buildjob.Spec{Tasks: []string{"test", "-Dorg.gradle.jvmargs=x"}}, "gradle task"},
		"no task":                 {req, buildjob.Spec{}, "no task"},
		"an option in the filter": {req, buildjob.Spec{Tasks: []string{"test"}, Tests: "X --init-script y"}, "test filter"},
		"an option as the filter": {req, buildjob.Spec{Tasks: []string{"test"}, Tests: "--init-script"}, "test filter"},
		"spaces in the filter":    {req, buildjob.Spec{Tasks: []string{"test"}, Tests: "com.acme Foo"}, "test filter"},
		"root": {buildjob.Request{Tenant: "acme", Env: "dev", Conversation: "c_ok", ID: "b", RunAsUser: 0},
			buildjob.Spec{Tasks: []string{"test"}}, "never root"},
		"a path as conversation": {buildjob.Request{Tenant: "acme", Env: "dev", Conversation: "../c_ok", ID: "b", RunAsUser: uid},
			buildjob.Spec{Tasks: []string{"test"}}, "conversation"},
		"no working tree": {localRequest("c_none", uid), buildjob.Spec{Tasks: []string{"test"}}, "working tree"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := lr.Run(t.Context(), tc.req, tc.spec, buildjob.Hooks{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one about %q", err, tc.want)
			}
		})
	}
	if os.Geteuid() == 0 {
		// A working tree of another user (root's, here) is not entered.
		if err := os.Mkdir(filepath.Join(ws, "c_root"), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := lr.Run(t.Context(), localRequest("c_root", uid), buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{}); err == nil || !strings.Contains(err.Error(), "owned by uid 0") {
			t.Errorf("a tree of root: %v, want refused", err)
		}
	}
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gradle ran for a refused request")
	}
	none := &buildjob.LocalRunner{Gradle: filepath.Join(tmpRoot, "no-gradle"), WorkspaceRoot: ws}
	_, err := none.Run(t.Context(), req, buildjob.Spec{Tasks: []string{"test"}}, buildjob.Hooks{})
	if !errors.Is(err, buildjob.ErrNoGradle) || !strings.Contains(err.Error(), "apt-get install gradle junit4") || !errors.Is(none.Check(), buildjob.ErrNoGradle) {
		t.Errorf("without gradle: %v, want ErrNoGradle saying what to install", err)
	}
}

// diskHog is a stand-in for gradle that writes 1 MiB at a time, up to
// 200 MiB, into its Gradle home ($HOME): as files, or into files it
// deleted but keeps open (seven of them: in a jail, one file alone cannot
// grow past the limit, RLIMIT_FSIZE).
const (
	diskHogFiles   = `i=0; while [ $i -lt 200 ]; do head -c 1048576 /dev/zero > "$HOME/f$i" || exit 3; i=$((i+1)); sleep 0.01; done; echo wrote-all`
	diskHogDeleted = `for n in 3 4 5 6 7 8 9; do eval "exec $n>\"\$HOME/h$n\""; rm "$HOME/h$n"; done; ` +
		`i=0; while [ $i -lt 200 ]; do eval "head -c 1048576 /dev/zero >&$((3 + i % 7))" || exit 3; i=$((i+1)); sleep 0.01; done; echo wrote-all`
)

// checkDiskLimited checks that a disk hog's build was killed over its
// limit and left neither processes nor its Gradle home behind.
func checkDiskLimited(t *testing.T, rep buildjob.Report, log *lines, tmpRoot, want string) {
	t.Helper()
	if o := rep.Outcome; o.Phase != buildjob.PhaseFailed || o.Reason != "DiskLimit" || rep.ExitCode != -1 {
		t.Fatalf("outcome %+v, exit code %d; want failed with DiskLimit, -1\n%s", o, rep.ExitCode, log)
	}
	if m := rep.Outcome.Message; !strings.Contains(m, "over the disk limit of 8 MiB") || !strings.Contains(m, want) {
		t.Errorf("message %q: want it to say what was over the 8 MiB limit (%q)", m, want)
	}
	if log.has("wrote-all") {
		t.Errorf("the build wrote all it meant to")
	}
	noBuildProcesses(t, tmpRoot)
	if homes, _ := filepath.Glob(filepath.Join(tmpRoot, "talkide-gradle-*")); len(homes) != 0 {
		t.Errorf("Gradle homes left: %v", homes)
	}
}

// TestLocalRunnerDiskLimit: a build writing past the disk limit into its
// Gradle home, outside the conversation's directories, is killed with
// DiskLimit; so is one hiding what it writes in a deleted file it holds
// open. Without a jail the limit is DiskLimit; a negative one is none.
func TestLocalRunnerDiskLimit(t *testing.T) {
	for _, tc := range []struct{ name, script, want string }{
		{"files", diskHogFiles, "Gradle home"},
		{"deleted", diskHogDeleted, "deleted but held open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, tmpRoot, uid := localSetup(t)
			const conv = "c_disk"
			emptyTree(t, ws, conv, uid)
			lr := &buildjob.LocalRunner{Gradle: fakeGradle(t, tmpRoot, tc.script), WorkspaceRoot: ws, TmpRoot: tmpRoot,
				DiskLimit: 8 << 20, DiskCheckEvery: 100 * time.Millisecond}
			log := &lines{}
			rep, err := lr.Run(t.Context(), localRequest(conv, uid), buildjob.Spec{Tasks: []string{"build"}}, buildjob.Hooks{Line: log.add})
			if err != nil {
				t.Fatal(err)
			}
			checkDiskLimited(t, rep, log, tmpRoot, tc.want)
		})
	}
	t.Run("unlimited", func(t *testing.T) {
		ws, tmpRoot, uid := localSetup(t)
		emptyTree(t, ws, "c_disk", uid)
		lr := &buildjob.LocalRunner{Gradle: fakeGradle(t, tmpRoot, `head -c 16777216 /dev/zero > "$HOME/f" && echo wrote-all`),
			WorkspaceRoot: ws, TmpRoot: tmpRoot, DiskLimit: -1, DiskCheckEvery: 10 * time.Millisecond}
		log := &lines{}
		rep, err := lr.Run(t.Context(), localRequest("c_disk", uid), buildjob.Spec{Tasks: []string{"build"}}, buildjob.Hooks{Line: log.add})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Outcome.Phase != buildjob.PhaseSucceeded || !log.has("wrote-all") {
			t.Errorf("outcome %+v: want succeeded without a limit\n%s", rep.Outcome, log)
		}
	})
}

// TestLocalRunnerDiskLimitJailed: in a jail, the limit is the jail's
// Limits.DiskBytes (the agents').
func TestLocalRunnerDiskLimitJailed(t *testing.T) {
	jail := testJail(t, sandbox.Limits{DiskBytes: 8 << 20})
	for _, tc := range []struct{ name, script, want string }{
		{"files", diskHogFiles, "Gradle home"},
		{"deleted", diskHogDeleted, "deleted but held open"},
		// A chain too deep to walk hides what is in it: it counts as over.
		{"deep", `cd "$HOME" && i=0; while [ $i -lt 300 ]; do mkdir d && cd d || exit 3; i=$((i+1)); done; sleep 10; echo wrote-all`, "Gradle home could not be measured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, tmpRoot, uid := localSetup(t)
			const conv = "c_disk_jailed"
			emptyTree(t, ws, conv, uid)
			lr := &buildjob.LocalRunner{Gradle: fakeGradle(t, tmpRoot, tc.script), WorkspaceRoot: ws, TmpRoot: tmpRoot,
				DiskCheckEvery: 100 * time.Millisecond,
				Jail:           jail}
			log := &lines{}
			rep, err := lr.Run(t.Context(), localRequest(conv, uid), buildjob.Spec{Tasks: []string{"build"}}, buildjob.Hooks{Line: log.add})
			if err != nil {
				t.Fatal(err)
			}
			checkDiskLimited(t, rep, log, tmpRoot, tc.want)
		})
	}
}

// testJail is a jail like the agents' with limits l (defaults for the
// rest), for a test run as root, as make test runs.
func testJail(t *testing.T, l sandbox.Limits) *sandbox.Jail {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root (a jail as an agent uid of its own), as make test runs")
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		t.Fatalf("bwrap: %v (make tools installs bubblewrap)", err)
	}
	prlimit, _ := exec.LookPath("prlimit")
	cg, err := sandbox.OpenCgroups("test-" + t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cg.Close)
	return &sandbox.Jail{Bwrap: bwrap, Prlimit: prlimit, Cgroups: cg, Limits: l.WithDefaults()}
}

// TestLocalRunnerBuildNetworkIsItsOwn: a build (Gradle running the
// agent's code) has a network of its own: a service on the host's
// loopback is out of its reach.
func TestLocalRunnerBuildNetworkIsItsOwn(t *testing.T) {
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host-service-reached\n"))
			c.Close()
		}
	}()
	ws, tmpRoot, uid := localSetup(t)
	const conv = "c_net"
	emptyTree(t, ws, conv, uid)
	script := fmt.Sprintf(`bash -c '(exec 3<>/dev/tcp/127.0.0.1/%d && cat <&3) 2>/dev/null || echo build-refused'`, host.Addr().(*net.TCPAddr).Port)
	lr := &buildjob.LocalRunner{Gradle: fakeGradle(t, tmpRoot, script), WorkspaceRoot: ws, TmpRoot: tmpRoot, Jail: testJail(t, sandbox.Limits{})}
	log := &lines{}
	if _, err := lr.Run(t.Context(), localRequest(conv, uid), buildjob.Spec{Tasks: []string{"build"}}, buildjob.Hooks{Line: log.add}); err != nil {
		t.Fatal(err)
	}
	if !log.has("build-refused") || log.has("host-service-reached") {
		t.Errorf("the build reached the host's loopback:\n%s", log)
	}
}
