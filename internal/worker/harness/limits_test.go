package harness

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/testlane"
	"github.com/talkide/talkide/internal/token"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// limitEvent waits for a limit_reached event of limit in e.
func limitEvent(t *testing.T, e *events, limit string, timeout time.Duration) contract.LimitReached {
	t.Helper()
	var got contract.LimitReached
	waitFor(t, "limit_reached "+limit, timeout, func() bool {
		for _, ev := range e.snapshot() {
			if ev.Type == contract.EventLimitReached {
				if l := payload[contract.LimitReached](t, ev); l.Limit == limit {
					got = l
					return true
				}
			}
		}
		return false
	})
	return got
}

// limitStopsTurn waits for e's limit_reached event of limit and the
// turn_failed that follows, checks the event with ok, and fails the test
// if any tool result printed one of the words the command would print had
// it gone on.
func limitStopsTurn(t *testing.T, e *events, limit string, ok func(contract.LimitReached) bool, words ...string) {
	t.Helper()
	l := limitEvent(t, e, limit, 2*time.Minute)
	if !ok(l) {
		t.Errorf("%s limit event: %+v", limit, l)
	}
	waitEvent(t, e, contract.EventTurnFailed, 0, 2*time.Minute)
	for _, ev := range e.snapshot() {
		for _, w := range words {
			if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), w) {
				t.Errorf("the turn went on past the %s limit: %s", limit, ev.Data)
			}
		}
	}
}

// TestAgentLimits is case C6's limits: a bounded memory hog and a bounded
// process loop run by one conversation's agent hit that conversation's
// limits; each becomes a limit_reached event, and the worker, the same
// conversation's next turn and another conversation's turn all go on.
func TestAgentLimits(t *testing.T) {
	r := startRig(t, rigOptions{limits: sandbox.Limits{MemoryBytes: 1 << 30, Processes: 160}})
	mustCreate(t, r.h, "hog")
	mustCreate(t, r.h, "other")
	e := r.follow(t, "hog")
	o := r.follow(t, "other")

	// 1.5 GB held by tail (no newline in its input) against a 1 GiB limit.
	mustSend(t, r.h, "hog", "m1", "please run `head -c 1500000000 /dev/zero | tail > /dev/null; echo hog-exit=$?`")
	mem := limitEvent(t, e, contract.LimitMemory, 3*time.Minute)
	if mem.Max != 1<<30 || mem.Used < 1 || !strings.Contains(mem.Message, "memory limit") {
		t.Errorf("memory limit event: %+v", mem)
	}
	waitEvent(t, e, contract.EventTurnCompleted, 0, 3*time.Minute)

	// 400 short-lived processes against a limit of 160 (the CLI's threads
	// count too); the loop's shell dies when a fork is refused.
	mustSend(t, r.h, "hog", "m2", "please run `sh -c 'i=0; while [ $i -lt 400 ]; do sleep 4 & i=$((i+1)); done' 2>/dev/null; echo loop-exit=$?`")
	_, i := waitEvent(t, e, contract.EventTurnCompleted, 0, 3*time.Minute)
	_, i = waitEvent(t, e, contract.EventTurnCompleted, i+1, 3*time.Minute)
	if testing.Verbose() {
		for _, ev := range e.snapshot() {
			t.Logf("%s %s", ev.Type, ev.Data)
		}
	}
	procs := limitEvent(t, e, contract.LimitProcesses, 2*time.Minute)
	if procs.Max != 160 || !strings.Contains(procs.Message, "160 processes") {
		t.Errorf("process limit event: %+v", procs)
	}

	// Survivors: another conversation, and this one's next turn.
	mustSend(t, r.h, "other", "m1", "please run `echo other-alive`")
	if tr, _ := waitEvent(t, o, contract.EventToolResult, 0, 3*time.Minute); !strings.Contains(payload[contract.ToolResult](t, tr).Content, "other-alive") {
		t.Errorf("the other conversation's command: %s", tr.Data)
	}
	time.Sleep(4500 * time.Millisecond) // the loop's sleeps end; not an assertion on time
	from := len(e.snapshot())
	mustSend(t, r.h, "hog", "m3", "please run `echo hog-alive`")
	waitEvent(t, e, contract.EventTurnCompleted, from, 3*time.Minute)
	var alive bool
	for _, ev := range e.snapshot()[from:] {
		alive = alive || ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "hog-alive")
	}
	if !alive {
		t.Errorf("the conversation's next turn did not run its command: %v", e.snapshot()[from:])
	}
}

// TestAgentDiskLimit: a conversation whose files grow past its disk limit
// gets a limit_reached event and its turn is stopped; one file can never
// grow past the limit at all (RLIMIT_FSIZE).
func TestAgentDiskLimit(t *testing.T) {
	r := startRig(t, rigOptions{diskLimit: 48 << 20})
	mustCreate(t, r.h, "disk")
	e := r.follow(t, "disk")
	mustSend(t, r.h, "disk", "m1", "please run `head -c 100000000 /dev/zero > big; ls -l big; head -c 30000000 /dev/zero > a; head -c 30000000 /dev/zero > b; sleep 60; echo not-stopped`")
	l := limitEvent(t, e, contract.LimitDisk, 3*time.Minute)
	if l.Max != 48<<20 || l.Used <= 48<<20 {
		t.Errorf("disk limit event: %+v", l)
	}
	end, _ := waitEvent(t, e, contract.EventTurnFailed, 0, 3*time.Minute)
	if f := payload[contract.TurnFailed](t, end); f.ClientMessageID != "m1" {
		t.Errorf("turn_failed: %+v", f)
	}
	for _, ev := range e.snapshot() {
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "not-stopped") {
			t.Error("the turn went on past the disk limit")
		}
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), " 100000000 ") {
			t.Error("one file grew past the disk limit")
		}
	}
}

// TestAgentDiskLimitCountsDeletedOpenFiles: files the agent deleted but
// keeps open still take disk space, and count.
func TestAgentDiskLimitCountsDeletedOpenFiles(t *testing.T) {
	r := startRig(t, rigOptions{diskLimit: 48 << 20})
	mustCreate(t, r.h, "held")
	e := r.follow(t, "held")
	mustSend(t, r.h, "held", "m1", "please run `sh -c 'exec 3>a 4>b; head -c 30000000 /dev/zero >&3; head -c 30000000 /dev/zero >&4; rm a b; sleep 60'; echo not-stopped`")
	limitStopsTurn(t, e, contract.LimitDisk, func(l contract.LimitReached) bool { return l.Used > 48<<20 }, "not-stopped")
}

// TestAgentMemoryLimitWithoutCgroups: where agents have no control group
// (a pod whose cgroup is read-only), an agent holding more than its memory
// limit is found by sampling and its turn stopped, with a limit_reached
// event; another conversation goes on. (The kernel's OOM killer would end
// the largest process of the whole worker, whichever conversation's.)
func TestAgentMemoryLimitWithoutCgroups(t *testing.T) {
	r := startRig(t, rigOptions{noCgroups: true, limits: sandbox.Limits{MemoryBytes: 400 << 20}})
	mustCreate(t, r.h, "hog")
	mustCreate(t, r.h, "other")
	e := r.follow(t, "hog")
	o := r.follow(t, "other")
	// 900 MB held by tail (no newline in its input) for a minute: it
	// cannot write them to a reader that does not read. Held only until
	// tail ends (about 1.5 s above the limit), they could fall between two
	// samples on a busy machine: the limit is on memory held, by sampling.
	mustSend(t, r.h, "hog", "m1", "please run `head -c 900000000 /dev/zero | tail | sleep 60; echo not-stopped`")
	mem := limitEvent(t, e, contract.LimitMemory, 3*time.Minute)
	if mem.Max != 400<<20 || mem.Used <= 400<<20 || !strings.Contains(mem.Message, "memory limit") {
		t.Errorf("memory limit event: %+v", mem)
	}
	waitEvent(t, e, contract.EventTurnFailed, 0, 3*time.Minute)
	for _, ev := range e.snapshot() {
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "not-stopped") {
			t.Error("the turn went on past the memory limit")
		}
	}
	mustSend(t, r.h, "other", "m1", "please run `echo other-alive`")
	if tr, _ := waitEvent(t, o, contract.EventToolResult, 0, 3*time.Minute); !strings.Contains(payload[contract.ToolResult](t, tr).Content, "other-alive") {
		t.Errorf("the other conversation's command: %s", tr.Data)
	}
}

// TestAgentDiskLimitIsNotOutrunBetweenWalks: with walks far apart, an agent
// can neither reserve space at once (fallocate is refused) nor fill the
// disk between two walks (the filesystem's growth triggers one); a turn
// that starts over the limit is told so at its start and stopped once its
// files grow, so use does not pile up turn after turn; and a turn that
// frees space completes.
func TestAgentDiskLimitIsNotOutrunBetweenWalks(t *testing.T) {
	r := startRig(t, rigOptions{diskLimit: 48 << 20, diskEvery: time.Hour})
	mustCreate(t, r.h, "fill")
	e := r.follow(t, "fill")
	mustSend(t, r.h, "fill", "m1", "please run `fallocate -l 2G pre; echo fallocate=$?; for i in 1 2 3; do head -c 30000000 /dev/zero > f$i; done; sleep 60; echo not-stopped`")
	l := limitEvent(t, e, contract.LimitDisk, 2*time.Minute)
	if l.Used <= 48<<20 || l.Used > 200<<20 {
		t.Errorf("disk limit event: %+v", l)
	}
	_, i := waitEvent(t, e, contract.EventTurnFailed, 0, 2*time.Minute)

	mustSend(t, r.h, "fill", "m2", "please run `head -c 20000000 /dev/zero > g; sleep 60; echo grew-anyway`")
	ev, j := waitEvent(t, e, contract.EventLimitReached, i, 2*time.Minute)
	if l := payload[contract.LimitReached](t, ev); !strings.Contains(l.Message, "may only free space") {
		t.Errorf("a turn starting over the limit: %+v", l)
	}
	ev, j = waitEvent(t, e, contract.EventLimitReached, j+1, 2*time.Minute)
	if l := payload[contract.LimitReached](t, ev); !strings.Contains(l.Message, "grew during a turn that may only free space") {
		t.Errorf("growth of a turn that may only free space: %+v", l)
	}
	_, j = waitEvent(t, e, contract.EventTurnFailed, j, 2*time.Minute)

	mustSend(t, r.h, "fill", "m3", "please run `rm -f f1 f2 f3 g pre; echo freed`")
	waitEvent(t, e, contract.EventTurnCompleted, j, 2*time.Minute)
	for _, ev := range e.snapshot() {
		if ev.Type == contract.EventToolResult && (strings.Contains(string(ev.Data), "not-stopped") || strings.Contains(string(ev.Data), "grew-anyway")) {
			t.Errorf("a turn went on past the disk limit: %s", ev.Data)
		}
		if ev.Type == contract.EventToolResult && strings.Contains(string(ev.Data), "fallocate=0") {
			t.Error("fallocate reserved 2 GB")
		}
	}
	if used, err := sandbox.DiskUsage(filepath.Join(r.h.cfg.WorkspaceRoot, "fill")); err != nil || used > 8<<20 {
		t.Errorf("after freeing: %d bytes used (%v)", used, err)
	}
}

// TestAgentFileLimit: a million empty files take no bytes but the
// filesystem's inodes: files are limited too.
func TestAgentFileLimit(t *testing.T) {
	r := startRig(t, rigOptions{fileLimit: 3000})
	mustCreate(t, r.h, "files")
	e := r.follow(t, "files")
	mustSend(t, r.h, "files", "m1", "please run `mkdir many && cd many && seq 20000 | xargs touch; sleep 60; echo not-stopped`")
	limitStopsTurn(t, e, contract.LimitFiles, func(l contract.LimitReached) bool { return l.Max == 3000 && l.Used > 3000 }, "not-stopped")
}

// TestAgentDiskLimitSeesPastThePathLimit: bytes at the bottom of a chain of
// directories longer than the kernel's path limit count like any others,
// and a chain too deep to walk counts as over.
func TestAgentDiskLimitSeesPastThePathLimit(t *testing.T) {
	r := startRig(t, rigOptions{diskLimit: 48 << 20})
	for conv, script := range map[string]string{
		"long": `perl -e '$n = "d" x 200; for (1..40) { mkdir $n or die; chdir $n or die } system("head -c 60000000 /dev/zero > x")'; sleep 60; echo not-stopped`,
		"deep": `perl -e 'for (1..400) { mkdir "d" or die; chdir "d" or die } system("head -c 1000 /dev/zero > x")'; sleep 60; echo not-stopped`,
	} {
		mustCreate(t, r.h, conv)
		e := r.follow(t, conv)
		mustSend(t, r.h, conv, "m1", "please run `"+script+"`")
		l := limitEvent(t, e, contract.LimitDisk, 2*time.Minute)
		if conv == "long" && l.Used <= 48<<20 || conv == "deep" && !strings.Contains(l.Message, "cannot measure") {
			t.Errorf("%s: %+v", conv, l)
		}
		waitEvent(t, e, contract.EventTurnFailed, 0, 2*time.Minute)
	}
}

// TestAgentNetworkIsItsOwn: an agent reaches its local gateway proxy (its
// turns run) and its own servers, and nothing else on the machine: not a
// service on the host's loopback, not another conversation's development
// server, not the host's sockets in /proc/net.
func TestAgentNetworkIsItsOwn(t *testing.T) {
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go http.Serve(host, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "host-service-reached") }))
	marker, err := net.Listen("unix", "@talkide-host-socket-"+token.NewID()[:8])
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	port := host.Addr().(*net.TCPAddr).Port
	r := startRig(t, rigOptions{})
	mustCreate(t, r.h, "a")
	mustCreate(t, r.h, "b")
	a, b := r.follow(t, "a"), r.follow(t, "b")
	mustSend(t, r.h, "a", "m1", "please run `(python3 -m http.server 48011 >/dev/null 2>&1 &); sleep 2; (exec 3<>/dev/tcp/127.0.0.1/48011) && echo a-own-server-up`")
	waitEvent(t, a, contract.EventTurnCompleted, 0, 2*time.Minute)
	mustSend(t, r.h, "b", "m1", fmt.Sprintf("please run `(exec 3<>/dev/tcp/127.0.0.1/48011) 2>/dev/null && echo b-reached-a || echo b-refused; (exec 4<>/dev/tcp/127.0.0.1/%d; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&4; cat <&4) 2>/dev/null || echo host-refused; grep -c talkide-host-socket /proc/net/unix | sed s/^/host-sockets-/`", port))
	waitEvent(t, b, contract.EventTurnCompleted, 0, 2*time.Minute)
	out := func(e *events) string {
		var sb strings.Builder
		for _, ev := range e.snapshot() {
			if ev.Type == contract.EventToolResult {
				sb.Write(ev.Data)
			}
		}
		return sb.String()
	}
	if got := out(a); !strings.Contains(got, "a-own-server-up") {
		t.Errorf("a could not reach its own server: %s", got)
	}
	got := out(b)
	for _, want := range []string{"b-refused", "host-refused", "host-sockets-0"} {
		if !strings.Contains(got, want) {
			t.Errorf("want %q in b's output: %s", want, got)
		}
	}
	if strings.Contains(got, "host-service-reached") || strings.Contains(got, "b-reached-a") {
		t.Errorf("b reached what is not its own: %s", got)
	}
}

// TestAgentDiskLimitOnAFilesystemLikeNFS: the Kubernetes session volume is
// NFS, which has no quotas per directory and no idmapped mounts; a FUSE
// filesystem (bindfs, issue 17's stand-in) takes its place. The limit holds
// there the same way: the filesystem's growth is seen between walks,
// fallocate is refused, and a chain past the path limit hides nothing (on
// this stand-in it cannot even be made: FUSE passes whole paths).
func TestAgentDiskLimitOnAFilesystemLikeNFS(t *testing.T) {
	testlane.NeedsNodeTools(t)
	if _, err := exec.LookPath("bindfs"); err != nil {
		t.Fatal("bindfs is not installed (`make node-tools` installs it: the NFS stand-in)")
	}
	base := t.TempDir()
	backing, vol := filepath.Join(base, "backing"), filepath.Join(base, "volume")
	for _, d := range []string{backing, vol} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("bindfs", "-o", "allow_other,dev,suid", backing, vol).CombinedOutput(); err != nil {
		t.Fatalf("bindfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("fusermount3", "-u", "-z", vol).Run() })
	var st unix.Statfs_t
	if err := unix.Statfs(vol, &st); err != nil || st.Type != 0x65735546 { // FUSE_SUPER_MAGIC
		t.Fatalf("the volume is not a FUSE filesystem: type %#x, %v", st.Type, err)
	}
	r := startRig(t, rigOptions{volume: vol, diskLimit: 48 << 20, diskEvery: time.Hour})
	mustCreate(t, r.h, "nfs")
	e := r.follow(t, "nfs")
	t.Cleanup(func() {
		if t.Failed() {
			for _, ev := range e.snapshot() {
				t.Logf("%s %s", ev.Type, ev.Data)
			}
		}
	})
	mustSend(t, r.h, "nfs", "m1", "please run `fallocate -l 1G pre; echo fallocate=$?; perl -e '$n = \"d\" x 200; for (1..30) { mkdir $n or die; chdir $n or die } system(\"head -c 30000000 /dev/zero > x\")' || echo deep-chain-refused; head -c 30000000 /dev/zero > y; head -c 30000000 /dev/zero > z; sleep 60; echo not-stopped`")
	limitStopsTurn(t, e, contract.LimitDisk, func(l contract.LimitReached) bool { return l.Used > 48<<20 }, "not-stopped", "fallocate=0")
}
