package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// agentDir returns a fresh directory agents (any uid) can write to: mode
// 1777, like /tmp, with searchable parents.
func agentDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "talkide-uids-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o1777); err != nil {
		t.Fatal(err)
	}
	return d
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs processes as other uids")
	}
}

// runAs starts script with sh as uid and waits for sh itself; whatever it
// put in the background keeps running.
func runAs(t *testing.T, uid uint32, script string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}, Setsid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run as %d: %v: %s", uid, err, out)
	}
}

// TestUIDsAreReleasedAndReusedClean guards against case C6's exhaustion:
// uids claimed per conversation and never released. A range of one uid is
// full after one claim; Release kills the uid's processes however they
// detached (own session, cleared environment, double fork), removes the
// conversation's directories and the files the uid left in world-writable
// places, and only then lets another conversation claim the uid.
func TestUIDsAreReleasedAndReusedClean(t *testing.T) {
	needRoot(t)
	const uid = 3_910_001
	r := UIDRange{First: uid, Count: 1, Dir: filepath.Join(t.TempDir(), "uids"), HostDir: filepath.Join(t.TempDir(), "host")}
	shared := agentDir(t)
	r.SweepDirs = []string{shared}
	t.Cleanup(func() { _ = KillUID(uid) })

	got, err := r.Claim("conv-a")
	if err != nil || got != uid {
		t.Fatalf("Claim(conv-a) = %d, %v; want %d", got, err, uid)
	}
	if _, err := r.Claim("conv-b"); !errors.Is(err, ErrNoUID) {
		t.Fatalf("Claim(conv-b) on a full range: got %v, want ErrNoUID", err)
	}
	// conv-a's agent: files in its directory and in the shared one, and
	// processes that left its session, group and environment.
	own := filepath.Join(agentDir(t), "workspace")
	if err := os.Mkdir(own, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, uid, uid); err != nil {
		t.Fatal(err)
	}
	runAs(t, uid, fmt.Sprintf(`echo secret > %[1]s/notes; echo left > %[2]s/leftover; mkdir %[2]s/d; echo x > %[2]s/d/f
setsid sleep 3001 >/dev/null 2>&1 &
setsid env -i /bin/sleep 3002 >/dev/null 2>&1 &
sh -c 'setsid sh -c "sleep 3003 & exit 0" &' >/dev/null 2>&1
exit 0`, own, shared))
	if len(ProcessesOf(uid)) == 0 {
		t.Fatal("the agent's background processes are not running")
	}
	// A file of another uid in the shared dir stays.
	if err := os.WriteFile(filepath.Join(shared, "root-file"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Release refuses an owner that does not hold the uid, touching nothing.
	if err := r.Release("conv-b", uid, own); !errors.Is(err, ErrUIDTaken) {
		t.Errorf("Release by another owner: got %v, want ErrUIDTaken", err)
	}
	if len(ProcessesOf(uid)) == 0 {
		t.Fatal("a refused Release killed the uid's processes")
	}

	if err := r.Release("conv-a", uid, own); err != nil {
		t.Fatal(err)
	}
	if pids := ProcessesOf(uid); len(pids) != 0 {
		t.Errorf("processes of the released uid still run: %v", pids)
	}
	for _, p := range []string{own, filepath.Join(shared, "leftover"), filepath.Join(shared, "d")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survives the release (err %v)", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(shared, "root-file")); err != nil {
		t.Errorf("release removed another uid's file: %v", err)
	}
	if got, err := r.Claim("conv-b"); err != nil || got != uid {
		t.Errorf("Claim(conv-b) after the release: %d, %v; want %d", got, err, uid)
	}
}

// TestTwoWorkersOnOneHostNeverShareAUID guards against case C6's
// collision: two workers (two session volumes) on one host claimed from
// the same range independently. With the host-wide claim directory every
// uid goes to one conversation of one volume; a conversation whose stored
// uid the other volume took meanwhile is refused rather than shared.
func TestTwoWorkersOnOneHostNeverShareAUID(t *testing.T) {
	host := filepath.Join(t.TempDir(), "run-talkide-uids")
	a := UIDRange{First: 3_920_000, Count: 8, Dir: filepath.Join(t.TempDir(), "vol-a", "agent-uids"), HostDir: host}
	b := a
	b.Dir = filepath.Join(t.TempDir(), "vol-b", "agent-uids")
	owners := map[uint32]string{}
	for i := range 4 {
		for name, r := range map[string]UIDRange{"a": a, "b": b} {
			// The same conversation ids on both volumes: the worst case for
			// the hash-chosen starting points.
			conv := fmt.Sprintf("conv-%d", i)
			uid, err := r.Claim(conv)
			if err != nil {
				t.Fatalf("volume %s Claim(%s): %v", name, conv, err)
			}
			if prev, ok := owners[uid]; ok {
				t.Fatalf("uid %d given to %s and to %s/%s", uid, prev, name, conv)
			}
			owners[uid] = name + "/" + conv
		}
	}
	if _, err := a.Claim("one-too-many"); !errors.Is(err, ErrNoUID) {
		t.Errorf("a ninth claim on the host: got %v, want ErrNoUID", err)
	}
	// A conversation of volume a moves to a host where volume b holds its
	// uid: refused.
	var uidOfA uint32
	for u, o := range owners {
		if o == "a/conv-0" {
			uidOfA = u
		}
	}
	other := b
	other.HostDir = filepath.Join(t.TempDir(), "other-host")
	if _, err := claimFile(other.volPath(uidOfA), "x"); err != nil {
		t.Fatal(err)
	}
	if err := a.Hold("conv-0", uidOfA); err != nil {
		t.Errorf("Hold on its own host: %v", err)
	}
	if err := b.Hold("conv-0", uidOfA); !errors.Is(err, ErrUIDTaken) {
		t.Errorf("Hold of a uid another volume holds on this host: got %v, want ErrUIDTaken", err)
	}
}

// TestClaimSkipsAUIDInUse: a uid some process runs as (a worker that does
// not share the host claims, a leftover) is never handed out.
func TestClaimSkipsAUIDInUse(t *testing.T) {
	needRoot(t)
	const uid = 3_930_001
	t.Cleanup(func() { _ = KillUID(uid) })
	runAs(t, uid, "setsid sleep 3004 >/dev/null 2>&1 & exit 0")
	r := UIDRange{First: uid, Count: 2, Dir: filepath.Join(t.TempDir(), "uids")}
	for _, conv := range []string{"c1", "c2"} {
		got, err := r.Claim(conv)
		if conv == "c1" && (err != nil || got != uid+1) {
			t.Errorf("Claim(c1) = %d, %v; want %d (the free uid)", got, err, uid+1)
		}
		if conv == "c2" && !errors.Is(err, ErrNoUID) {
			t.Errorf("Claim(c2) = %d, %v; want ErrNoUID (the other uid runs a process)", got, err)
		}
	}
}

func TestRemoveOwnedByDoesNotFollowLinks(t *testing.T) {
	needRoot(t)
	const uid = 3_940_001
	shared := agentDir(t)
	keep := filepath.Join(t.TempDir(), "keep")
	if err := os.MkdirAll(keep, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keep, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(shared, "link")
	if err := os.Symlink(keep, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := RemoveOwnedBy(shared, uid); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the uid's symlink survives: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(keep, "f")); err != nil || !strings.Contains(string(b), "x") {
		t.Errorf("the link's target was touched: %v", err)
	}
}

// TestProcessesOfNeverListsTheCaller: KillUID signals what ProcessesOf
// lists, so the caller must never be among them (it once could be, when
// the caller's main thread had taken the uid's credentials).
func TestProcessesOfNeverListsTheCaller(t *testing.T) {
	for _, pid := range ProcessesOf(uint32(os.Geteuid())) {
		if pid == os.Getpid() {
			t.Fatal("ProcessesOf lists the calling process")
		}
	}
	if err := KillUID(0); err == nil {
		t.Error("KillUID(0) must be refused")
	}
}

// TestReleaseRemovesDeepTrees: a conversation's directory and a tree of
// its uid in a shared directory, each 25,000 levels deep, are removed by
// Release within an open-files limit of 256 (os.RemoveAll needed a
// descriptor per level, failed, and left the uid claimed).
func TestReleaseRemovesDeepTrees(t *testing.T) {
	needRoot(t)
	const uid = 3_910_011
	r := UIDRange{First: uid, Count: 1, Dir: filepath.Join(t.TempDir(), "uids")}
	shared := agentDir(t)
	r.SweepDirs = []string{shared}
	if _, err := r.Claim("conv-deep"); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(agentDir(t), "workspace")
	for _, top := range []string{own, filepath.Join(shared, "deep")} {
		if err := os.Mkdir(top, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(top, uid, uid); err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Open(top, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 25000 {
			if err := syscall.Mkdirat(fd, "d", 0o700); err != nil {
				t.Fatalf("level %d: %v", i, err)
			}
			next, err := syscall.Openat(fd, "d", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
			if err != nil {
				t.Fatalf("level %d: %v", i, err)
			}
			syscall.Close(fd)
			fd = next
		}
		syscall.Close(fd)
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	err := r.Release("conv-deep", uid, own)
	if rerr := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("Release: %.300v", err)
	}
	for _, p := range []string{own, filepath.Join(shared, "deep")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survives the release (err %v)", p, err)
		}
	}
	if claims, err := r.Claims(); err != nil || len(claims) != 0 {
		t.Errorf("claims after the release: %v, %v; want none", claims, err)
	}
}
