package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Without a control group (a pod whose cgroup is read-only) the jail still
// bounds the agent's processes, by the kernel's per-user limit of its uid,
// and marks every agent process first in line for the OOM killer, so the
// worker survives an agent that exhausts the pod's memory.
func TestJailWithoutCgroupsLimitsProcessesAndMarksForOOM(t *testing.T) {
	j, u, dir := testJail(t, Limits{Processes: 30})
	j.Cgroups.Close()
	j.Cgroups = nil
	out, c := runJailed(t, j, u, dir, `cat /proc/self/oom_score_adj; for i in $(seq 60); do sleep 5 & done; echo spawned`)
	defer c.Close()
	if f := strings.Fields(out); len(f) == 0 || f[0] != strconv.Itoa(OOMScoreAdj) {
		t.Errorf("oom_score_adj of the agent: %q, want %d", out, OOMScoreAdj)
	}
	if !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("60 processes started under a limit of 30: %q", out)
	}
}

// Where the runtime masks /proc (every pod with hostUsers: true), no
// procfs can be mounted in the agent's namespaces; Check then gives the
// agent the worker's /proc and says so (SharedProc) instead of failing.
// The masked /proc is made here as runtimes make it: /dev/null mounted over
// a file of it (/proc/keys, or /proc/timer_list), in a mount namespace of
// the check's own.
func TestCheckFallsBackToTheWorkersProcWhereProcIsMasked(t *testing.T) {
	if os.Getenv("TALKIDE_TEST_MASKED_PROC") == "1" {
		j, _, dir := testJail(t, Limits{})
		if err := j.Check(&User{UID: 299990, GID: 299990}, dir+"/check"); err != nil {
			t.Fatalf("check under a masked /proc: %v", err)
		}
		if !j.SharedProc {
			t.Fatal("check under a masked /proc passed without SharedProc: the test's mask did not take")
		}
		out, c := runJailed(t, j, &User{UID: 299990, GID: 299990}, dir, `ls /proc | grep -c '^[0-9]'`)
		c.Close()
		if n, _ := strconv.Atoi(strings.TrimSpace(out)); n < 10 {
			t.Errorf("with the worker's /proc the agent sees %q processes, want the host's", out)
		}
		return
	}
	// With a /proc of its own, the agent may make no user namespace.
	{
		j, u, dir := testJail(t, Limits{})
		out, c := runJailed(t, j, u, dir, `unshare -Ur id 2>&1; echo rc=$?`)
		c.Close()
		if !strings.Contains(out, "rc=1") || strings.Contains(out, "uid=0") {
			t.Errorf("a user namespace inside the jail: %q", out)
		}
	}
	j, _, dir := testJail(t, Limits{})
	if err := j.Check(&User{UID: 299990, GID: 299990}, dir+"/check"); err != nil || j.SharedProc {
		t.Fatalf("check on this host: %v, SharedProc %v: want a private /proc", err, j.SharedProc)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`f=/proc/keys; [ -e $f ] || f=/proc/timer_list; mount --bind /dev/null $f && exec "$0" -test.run '^TestCheckFallsBackToTheWorkersProcWhereProcIsMasked$' -test.count=1`, os.Args[0])
	cmd.Env = append(os.Environ(), "TALKIDE_TEST_MASKED_PROC=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("under a masked /proc: %v\n%s", err, out)
	}
}

// The agent's memory filesystems are sized by its memory limit (their
// pages are memory no process holds), /dev is read-only around /dev/shm,
// and the jail's resident memory is measured (ResidentBytes) where no
// cgroup counts it.
func TestJailMemoryFilesystemsAreSized(t *testing.T) {
	j, u, dir := testJail(t, Limits{MemoryBytes: 64 << 20})
	out, c := runJailed(t, j, u, dir, `for d in /tmp /var/tmp /dev/shm; do dd if=/dev/zero of=$d/fill bs=1M count=40 2>/dev/null; echo "$d $(( $(stat -c %s $d/fill) >> 20 ))"; done; touch /dev/x 2>&1 | head -c 60; echo`)
	defer c.Close()
	want := map[string]int{"/tmp": 16, "/var/tmp": 8, "/dev/shm": 8}
	for d, mb := range want {
		if !strings.Contains(out, d+" "+strconv.Itoa(mb)+"\n") {
			t.Errorf("%s holds more or less than %d MiB (a quarter and eighths of the 64 MiB limit): %q", d, mb, out)
		}
	}
	if !strings.Contains(out, "Read-only file system") {
		t.Errorf("/dev is writable: %q", out)
	}
	// 24 MB held: bash reading a command's output into a variable peaks at
	// about twice what it keeps, and 40 MB (80 at the peak) outgrew the
	// jail's own 64 MiB, whose OOM killer then ended the shell before it
	// was measured, on some hosts.
	c2, err := j.Command(Spec{Name: "rss", User: u, Path: "/bin/bash", Args: []string{"-c", `x=$(head -c 24000000 /dev/zero | tr '\0' a); sleep 5`},
		Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir, Writable: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { c2.Kill(); c2.Cmd.Wait(); c2.Close() }()
	var rss int64
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline) && rss < 22<<20; time.Sleep(100 * time.Millisecond) {
		rss = c2.ResidentBytes()
	}
	if rss < 22<<20 {
		t.Errorf("ResidentBytes %d MiB while a shell of the jail holds a 24 MB string", rss>>20)
	}
}

// Without a control group the agent's /tmp, /var/tmp and /dev/shm are
// directories of its scratch space on disk (counted in its disk use), not
// memory filesystems nothing would count.
func TestJailWithoutCgroupsKeepsTmpOnDisk(t *testing.T) {
	j, u, dir := testJail(t, Limits{MemoryBytes: 64 << 20})
	j.Cgroups.Close()
	j.Cgroups = nil
	scratch := filepath.Join(filepath.Dir(dir), "scratch")
	if err := os.Mkdir(scratch, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(scratch, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	out, c := runSpec(t, j, Spec{Name: "scratch", User: u, Path: "/bin/bash", Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir,
		Writable: []string{dir, scratch}, Scratch: scratch,
		Args: []string{"-c", `for d in /tmp /var/tmp /dev/shm; do head -c 30000000 /dev/zero > $d/fill || echo "$d refused"; done; touch /dev/x 2>&1`}})
	c.Close()
	for _, d := range []string{".tmp", ".var-tmp", ".dev-shm"} {
		st, err := os.Stat(filepath.Join(scratch, d, "fill"))
		if err != nil || st.Size() != 30000000 {
			t.Errorf("%s/fill on disk: %v %v (output %q)", d, st, err, out)
		}
	}
	if !strings.Contains(out, "Read-only file system") {
		t.Errorf("/dev is writable: %q", out)
	}
}

// The jail's seccomp filter: an agent cannot reserve disk faster than it
// can write it (fallocate is refused, glibc's posix_fallocate falls back to
// writing, within RLIMIT_FSIZE; io_uring, whose operations a filter does
// not see, is refused too), nor make a user namespace of its own;
// ordinary work (forks, threads, writes) goes on.
func TestJailSeccompRefusesPreallocationAndUserNamespaces(t *testing.T) {
	j, u, dir := testJail(t, Limits{DiskBytes: 64 << 20})
	j.SharedProc = true // as in a pod: bwrap's --disable-userns is not there
	out, _ := runJailed(t, j, u, dir, `
fallocate -l 1G pre 2>&1 | sed 's/^/fallocate: /'
: > keep; fallocate -n -l 1G keep 2>&1 | sed 's/^/keep-size: /'
unshare -U true 2>&1 | sed 's/^/unshare: /'
perl -e 'require "syscall.ph"; syscall(&SYS_unshare, 0x10000000) == -1 and print "unshare-syscall: $!\n"'
perl -e 'syscall(425, 1, 0) == -1 and print "io_uring: $!\n"'
perl -e 'open F, ">", "resv" or die; for $r (0x40305828, 0x4030582a, 0x40305839) { my $b = pack("s s x4 q q l L l4", 0, 0, 0, 1<<30, 0, 0, 0, 0, 0, 0); ioctl(F, $r, $b) or print "ioctl-prealloc: $!\n" }'
du -k resv | awk '{print "allocated resv " $1}'
(sleep 0.1; echo forked) & wait
head -c 1000000 /dev/zero > w && echo wrote
du -k pre keep 2>/dev/null | awk '{print "allocated " $2 " " $1}'`)
	for _, want := range []string{"fallocate: fallocate: fallocate failed: Operation not supported", "keep-size: fallocate: fallocate failed: keep size mode is unsupported",
		"unshare: unshare: unshare failed: Operation not permitted", "unshare-syscall: Operation not permitted", "io_uring: Function not implemented", "ioctl-prealloc: Operation not supported\nioctl-prealloc: Operation not supported\nioctl-prealloc: Operation not supported", "allocated resv 0", "forked", "wrote"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in the output:\n%s", want, out)
		}
	}
	if strings.Contains(out, "allocated pre 1") || strings.Contains(out, "allocated keep 1") {
		t.Errorf("a gigabyte was reserved:\n%s", out)
	}
}
