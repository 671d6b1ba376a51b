package sandbox

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// chain makes depth directories named name, one in the other, under dir
// (by descriptors: the path soon passes the kernel's limit) and writes
// size bytes into a file at the bottom.
func chain(t *testing.T, dir, name string, depth, size int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < depth; i++ {
		if err := unix.Mkdirat(fd, name, 0o700); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	f, err := unix.Openat(fd, "payload", unix.O_WRONLY|unix.O_CREAT, 0o600)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(f, make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	unix.Close(f)
	t.Cleanup(func() { RemoveTree(filepath.Join(dir, name)) })
}

// A tree deeper than the path limit hides nothing: the walk goes by
// descriptors and counts what lies at the bottom.
func TestMeasureDiskSeesBelowThePathLimit(t *testing.T) {
	dir := t.TempDir()
	name := strings.Repeat("d", 200)
	chain(t, dir, name, 60, 8<<20) // a path of 12,000 bytes
	u := MeasureDisk([]string{dir}, 0)
	if u.Bytes < 8<<20 || u.Unmeasured != "" || u.Files < 62 {
		t.Errorf("a file 60 directories (12,000 bytes of path) down: %+v", u)
	}
}

// What the walk cannot enter counts as unmeasured (over any limit), and
// says where.
func TestMeasureDiskCountsTooDeepAsUnmeasured(t *testing.T) {
	dir := t.TempDir()
	chain(t, dir, "a", MaxDiskDepth+10, 1<<20)
	u := MeasureDisk([]string{dir}, 0)
	if !strings.Contains(u.Unmeasured, "deeper than "+strconv.Itoa(MaxDiskDepth)) || !strings.HasPrefix(u.Unmeasured, "a/a/a") {
		t.Errorf("a chain deeper than %d: %+v", MaxDiskDepth, u)
	}
	if _, err := DiskUsage(dir); err == nil {
		t.Error("DiskUsage gave no error for a tree it could not measure")
	}
}

// Each inode's bytes count once (hard links), each name counts as a file,
// links are not followed, and the walk stops past maxFiles.
func TestMeasureDiskCountsNames(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "f"), make([]byte, 1<<20), 0o600))
	for i := 0; i < 50; i++ {
		must(os.Link(filepath.Join(dir, "f"), filepath.Join(dir, "l"+strconv.Itoa(i))))
	}
	must(os.Symlink("/usr", filepath.Join(dir, "usr")))
	must(os.Mkdir(filepath.Join(dir, "many"), 0o700))
	for i := 0; i < 3000; i++ {
		f, err := os.Create(filepath.Join(dir, "many", strconv.Itoa(i)))
		must(err)
		f.Close()
	}
	u := MeasureDisk([]string{dir}, 0)
	// dir, f and its 50 links (names each; bytes once), the symbolic link,
	// many and its 3000 files.
	if u.Files != 1+1+50+1+1+3000 || u.Bytes < 1<<20 || u.Bytes > 2<<20 || u.Stopped {
		t.Errorf("measure: %+v", u)
	}
	u = MeasureDisk([]string{dir}, 1000)
	if !u.Stopped || u.Files != 1001 {
		t.Errorf("with at most 1000 inodes: %+v", u)
	}
}

// Measuring many small files costs the worker little memory: names are
// read a batch at a time, and only multiply linked files are remembered.
func TestMeasureDiskMemoryPerFile(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 100,000 files")
	}
	dir := t.TempDir()
	const n = 100000
	for i := 0; i < n/1000; i++ {
		sub := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 1000; j++ {
			fd, err := unix.Open(filepath.Join(sub, strconv.Itoa(j)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	u := MeasureDisk([]string{dir}, 0)
	runtime.ReadMemStats(&after)
	if u.Files != n+n/1000+1 {
		t.Errorf("files %d, want %d", u.Files, n+n/1000+1)
	}
	perFile := float64(after.TotalAlloc-before.TotalAlloc) / n
	t.Logf("%.0f bytes allocated per file measured", perFile)
	if perFile > 100 {
		t.Errorf("%.0f bytes allocated per file measured, want at most 100", perFile)
	}
}

// A file mapped, closed and deleted still takes its disk: DeletedOpenBytes
// finds it among the process's mapped files, also once the thread-group
// leader exited.
func TestDeletedOpenBytesSeesMappedFiles(t *testing.T) {
	t.Run("by the process", func(t *testing.T) { seesMappedFile(t, "time.sleep(30)", false) })
	// The leader's maps is empty once it exited; its threads share the map.
	t.Run("by a thread whose leader exited", func(t *testing.T) {
		seesMappedFile(t, "import threading\nthreading.Thread(target=time.sleep, args=(30,)).start()\nlibc.syscall(60, 0)  # SYS_exit: the leader alone", true)
	})
}

// seesMappedFile runs a process that maps, closes and deletes an 8 MiB
// file, then runs then, and checks DeletedOpenBytes counts the file (once
// the leader's maps shows nothing, if leaderExits).
func seesMappedFile(t *testing.T, then string, leaderExits bool) {
	cmd := exec.Command("python3", "-c", `
import ctypes, os, time
fd = os.open("x", os.O_RDWR | os.O_CREAT, 0o600)
os.write(fd, b"\0" * (8 << 20))
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
assert libc.mmap(None, 4096, 3, 1, fd, 0) not in (None, ctypes.c_void_p(-1).value)
os.close(fd)
os.unlink("x")
print("ready", flush=True)
`+then+"\n")
	startReady(t, cmd)
	for deadline := time.Now().Add(10 * time.Second); leaderExits; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/maps"); err == nil && len(b) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader's maps still shows mappings")
		}
	}
	if n := DeletedOpenBytes([]int{cmd.Process.Pid}); n < 8<<20 {
		t.Errorf("a mapped, deleted 8 MiB file: %d bytes seen", n)
	}
}

// While a jail is frozen (as the worker walks its files) none of its
// processes runs, however it detached; thawed, they go on.
func TestJailFreeze(t *testing.T) {
	j, u, dir := testJail(t, Limits{})
	c, err := j.Command(Spec{Name: "freeze", User: u, Path: "/bin/bash", Env: []string{"PATH=/usr/bin:/bin"}, Dir: dir, Writable: []string{dir},
		Args: []string{"-c", `(setsid bash -c 'i=0; while :; do i=$((i+1)); echo $i > n2; sleep 0.01; done' &); i=0; while :; do i=$((i+1)); echo $i > n1; sleep 0.01; done`}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { c.Kill(); c.Cmd.Wait(); c.Close() }()
	read := func() string {
		a, _ := os.ReadFile(filepath.Join(dir, "n1"))
		b, _ := os.ReadFile(filepath.Join(dir, "n2"))
		return strings.TrimSpace(string(a)) + "/" + strings.TrimSpace(string(b))
	}
	// Both loops have written before the freeze (the detached one starts
	// later, later still on a loaded host: frozen before its first write,
	// its count was empty and the check below meaningless).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if a, b, _ := strings.Cut(read(), "/"); a != "" && b != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the jail's two loops did not both start: %s", read())
		}
	}
	thaw := c.Freeze()
	time.Sleep(100 * time.Millisecond) // a write under way ends
	frozen := read()
	time.Sleep(400 * time.Millisecond)
	if now := read(); now != frozen {
		t.Errorf("the jail ran while frozen: %s, then %s", frozen, now)
	}
	thaw()
	time.Sleep(400 * time.Millisecond)
	f1, f2, _ := strings.Cut(frozen, "/")
	if n1, n2, _ := strings.Cut(read(), "/"); n1 == f1 || n2 == f2 {
		t.Errorf("the jail did not go on after thawing: %s, then %s/%s", frozen, n1, n2)
	}
}

// A thread that unshared its file table (unshare(CLONE_FILES)) can hold a
// deleted file no other thread has: DeletedOpenBytes reads that thread's
// descriptors too, while it skips the threads sharing the process's.
func TestDeletedOpenBytesSeesAThreadsOwnFiles(t *testing.T) {
	cmd := exec.Command("python3", "-c", `
import ctypes, os, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def hold():
    assert libc.unshare(0x400) == 0, ctypes.get_errno()  # CLONE_FILES
    fd = os.open("y", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"\0" * (8 << 20))
    os.unlink("y")
    print("ready", flush=True)
    time.sleep(30)
for _ in range(4):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
threading.Thread(target=hold, daemon=True).start()
time.sleep(30)
`)
	startReady(t, cmd)
	own := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/fd/"
	fds, _ := os.ReadDir(own)
	for _, fd := range fds {
		if target, _ := os.Readlink(own + fd.Name()); strings.HasSuffix(target, "y (deleted)") {
			t.Fatalf("the process's own table holds the file (%s); it should be the thread's alone", target)
		}
	}
	if n := DeletedOpenBytes([]int{cmd.Process.Pid}); n < 8<<20 {
		t.Errorf("an 8 MiB file deleted while a thread with its own table holds it: %d bytes seen", n)
	}
}

// startReady starts cmd in a temporary directory, ends it when the test
// ends, and waits for it to print "ready".
func startReady(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Dir = t.TempDir()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 6)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("the test's process: %q %v", buf, err)
	}
}
