package sandbox

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testJail is a jail with the host's bwrap and, when the host has them,
// control groups; the tests run as root here and in CI, where both must
// work, so a missing piece fails rather than skips.
func testJail(t *testing.T, l Limits) (*Jail, *User, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (agents of their own uid); CI runs as root")
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		t.Fatalf("bwrap: %v (make tools installs bubblewrap)", err)
	}
	prlimit, _ := exec.LookPath("prlimit")
	cg, err := OpenCgroups("test-" + strings.ReplaceAll(t.Name(), "/", "_"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cg.Close)
	u := &User{UID: 299990, GID: 299990}
	dir := filepath.Join(t.TempDir(), "conv")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := u.PrepareDir(filepath.Dir(filepath.Dir(dir)), dir); err != nil {
		t.Fatal(err)
	}
	return &Jail{Bwrap: bwrap, Prlimit: prlimit, Cgroups: cg, Limits: l.WithDefaults()}, u, dir
}

func runJailed(t *testing.T, j *Jail, u *User, dir, script string, files ...File) (string, *Cell) {
	t.Helper()
	return runSpec(t, j, Spec{Name: "c1", User: u, Path: "/bin/bash", Args: []string{"-c", script},
		Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir, Writable: []string{dir}, Files: files})
}

// runSpec runs spec in j to its end and returns its output.
func runSpec(t *testing.T, j *Jail, spec Spec) (string, *Cell) {
	t.Helper()
	c, err := j.Command(spec)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	c.Cmd.Stdout, c.Cmd.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	_ = c.Cmd.Wait()
	return out.String(), c
}

// hostProcesses returns the host's processes whose command line starts
// with s.
func hostProcesses(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.HasPrefix(strings.ReplaceAll(string(b), "\x00", " "), s) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestJailEndsDetachedProcesses is case C1: processes that left the
// process group and the session and cleared their environment end when the
// jailed program ends.
func TestJailEndsDetachedProcesses(t *testing.T) {
	j, u, dir := testJail(t, Limits{})
	out, c := runJailed(t, j, u, dir, `setsid sleep 870011 & setsid env -i sleep 870012 & nohup sleep 870013 >/dev/null 2>&1 & (sh -c 'sleep 870014 &' &) ; sleep 0.2; echo started`)
	defer c.Close()
	if !strings.Contains(out, "started") {
		t.Fatalf("probe: %q", out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := hostProcesses("sleep 87001")
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes outlived their jail: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestJailView: the agent sees only its own processes, its own directory
// read-write, the system read-only, the files it was given, and nothing of
// the worker's data.
func TestJailView(t *testing.T) {
	j, u, dir := testJail(t, Limits{})
	secret := filepath.Join(filepath.Dir(dir), "worker-secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `echo procs=$(ls /proc | grep -c '^[0-9]'); ` +
		`cat ` + secret + ` 2>/dev/null || echo no-secret; ` +
		`touch /usr/x 2>/dev/null || echo usr-ro; echo hi > ` + dir + `/w && echo dir-rw; ` +
		`cat /etc/claude-code/managed-settings.json; echo; test -r /etc/passwd && echo etc-ok; id -u; ` +
		`mv /etc/claude-code /etc/cc2 2>/dev/null || echo etc-ro; mkdir /x 2>/dev/null || echo root-ro; touch /run/x 2>/dev/null || echo run-ro`
	out, c := runJailed(t, j, u, dir, script, File{Path: "/etc/claude-code/managed-settings.json", Data: []byte(`{"x":1}`)})
	c.Close()
	// The jail's own mounts (/, /etc, /run) are the agent's tmpfs: read-only,
	// or it could rename the managed settings away.
	for _, want := range []string{"no-secret", "usr-ro", "dir-rw", `{"x":1}`, "etc-ok", "299990", "etc-ro", "root-ro", "run-ro"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "s3cret") {
		t.Error("the agent read a file beside its directory")
	}
	var procs int
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "procs="); ok {
			procs = len(v)
			if v != "1" && v != "2" && v != "3" && v != "4" && v != "5" {
				t.Errorf("the agent sees %s processes, want only its own few", v)
			}
		}
	}
	if procs == 0 {
		t.Errorf("no process count in %q", out)
	}
	if _, err := os.Stat("/etc/claude-code/managed-settings.json"); err == nil {
		t.Error("the jail's managed settings were written on the host")
	}
}

// TestJailLimits: a bounded process loop and a bounded memory hog hit their
// limits inside the jail; the counters say so and the jail's program goes on.
func TestJailLimits(t *testing.T) {
	j, u, dir := testJail(t, Limits{MemoryBytes: 96 << 20, Processes: 32})
	out, c := runJailed(t, j, u, dir,
		`head -c 300000000 /dev/zero | tail > /dev/null; echo hog-exit=$?; `+
			`sh -c 'i=0; while [ $i -lt 64 ]; do sleep 870051 & i=$((i+1)); done' 2>/dev/null; echo loop-exit=$?; echo survived`)
	defer c.Close()
	if !strings.Contains(out, "survived") {
		t.Fatalf("the jailed program did not survive its children's limits: %q", out)
	}
	got := c.Counters()
	if got.ProcessLimitHits == 0 {
		t.Errorf("process limit hits: got 0, want > 0 (%q)", out)
	}
	if got.OOMKills == 0 {
		t.Errorf("OOM kills: got 0, want > 0 (%q)", out)
	}
	c.Close()
	if left := hostProcesses("sleep 870051"); len(left) > 0 {
		t.Errorf("the loop's processes outlived the jail: %d left", len(left))
	}
}

// TestJailKillOrphans: what a command detached is ended; the program and
// its own children go on.
func TestJailKillOrphans(t *testing.T) {
	j, u, dir := testJail(t, Limits{})
	c, err := j.Command(Spec{Name: "c1", User: u, Path: "/bin/bash",
		Args: []string{"-c", `sleep 870211 & (setsid sleep 870212 &); (nohup sh -c 'sleep 870213' >/dev/null 2>&1 &); echo ready; read x; echo alive`},
		Env:  []string{"PATH=/usr/bin:/bin"}, Dir: dir, Writable: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	in, _ := c.Cmd.StdinPipe()
	out, _ := c.Cmd.StdoutPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("read: %q %v", buf, err)
	}
	waitFor := func(cond func() bool) bool {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if cond() {
				return true
			}
		}
		return false
	}
	waitFor(func() bool { return len(hostProcesses("sleep 87021")) == 3 })
	if n := c.KillOrphans(); n < 2 {
		t.Errorf("KillOrphans signalled %d processes, want the 2 detached ones (and their children)", n)
	}
	if !waitFor(func() bool { return len(hostProcesses("sleep 870212")) == 0 && len(hostProcesses("sleep 870213")) == 0 }) {
		t.Errorf("detached processes survived: %v", hostProcesses("sleep 87021"))
	}
	if len(hostProcesses("sleep 870211")) != 1 {
		t.Errorf("the program's own child was killed")
	}
	in.Write([]byte("x\n"))
	rest, _ := io.ReadAll(out)
	if !strings.Contains(string(rest), "alive") {
		t.Errorf("the program did not go on: %q", rest)
	}
	_ = c.Cmd.Wait()
}

// TestJailCleanupLeavesTheNextProcessAlone: the clean-up of a
// conversation's old process (reaped after the next one started, as after a
// crash) never touches the new process's control group.
func TestJailCleanupLeavesTheNextProcessAlone(t *testing.T) {
	j, u, dir := testJail(t, Limits{})
	start := func() *Cell {
		c, err := j.Command(Spec{Name: "c1", User: u, Path: "/bin/sleep", Args: []string{"30"},
			Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir, Writable: []string{dir}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	old := start()
	next := start()
	old.Kill()
	_ = old.Cmd.Wait()
	old.Close()
	exited := make(chan error, 1)
	go func() { exited <- next.Cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the next process ended with the old one's clean-up: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if len(next.cg.Processes()) == 0 {
		t.Error("the next process's control group is empty")
	}
	next.Kill()
	<-exited
	next.Close()
}

// TestCgroupCountersSeeLaterHits: Counters keeps its files open and reads
// them again from their start: hits after its first call are seen by the
// next. After Remove it reads zeros and opens nothing.
func TestCgroupCountersSeeLaterHits(t *testing.T) {
	j, _, _ := testJail(t, Limits{})
	g, err := j.Cgroups.New("counters", Limits{Processes: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	if c := g.Counters(); c.ProcessLimitHits != 0 {
		t.Fatalf("a new group's process limit hits: %d, want 0", c.ProcessLimitHits)
	}
	cmd := exec.Command("/bin/sh", "-c", `read go; i=0; while [ $i -lt 16 ]; do sleep 870052 >/dev/null & i=$((i+1)); done 2>/dev/null; echo forked`)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("go\n"))
	_ = cmd.Wait()
	if c := g.Counters(); c.ProcessLimitHits == 0 {
		t.Errorf("process limit hits after 16 forks under a limit of 4: 0, want > 0 (%q)", out.String())
	}
	g.Remove()
	if left := hostProcesses("sleep 870052"); len(left) > 0 {
		t.Errorf("the group's processes outlived it: %v", left)
	}
	// A late limit check (the watch's last tick) opens nothing again.
	if c := g.Counters(); c != (Counters{}) || g.counters[0].f != nil || g.counters[1].f != nil {
		t.Errorf("Counters after Remove: %+v, files open %v %v; want zeros and none", c, g.counters[0].f != nil, g.counters[1].f != nil)
	}
}
