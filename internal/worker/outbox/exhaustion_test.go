package outbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// guard bounds waits for something the outbox must do; it only turns a hang
// into a failure and says nothing about speed.
const guard = 30 * time.Second

// exhaustFiles lowers this process's soft RLIMIT_NOFILE to a little above
// the files open now and opens /dev/null until the kernel answers EMFILE,
// so the next file anyone in the process opens fails as at the real
// limit. release closes them and restores the limit.
func exhaustFiles(t *testing.T) (release func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = uint64(len(ents) + 32)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var held []*os.File
	release = func() {
		for _, f := range held {
			f.Close()
		}
		held = nil
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
			t.Errorf("restore RLIMIT_NOFILE: %v", err)
		}
	}
	for {
		f, err := os.Open(os.DevNull)
		if errors.Is(err, syscall.EMFILE) {
			return release
		}
		if err != nil {
			release()
			t.Fatalf("open %s: %v", os.DevNull, err)
		}
		held = append(held, f)
	}
}

// signalHandler is a slog handler that passes each record's message (with
// its err attribute) to a channel, dropping what nobody reads.
type signalHandler struct{ c chan string }

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			msg += ": " + a.Value.String()
		}
		return true
	})
	select {
	case h.c <- msg:
	default:
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// TestReportKeptWhileOutOfOpenFiles guards against the loss of W2: at the
// worker's open-files limit, an entry the outbox could not read was dropped
// from its queue (and so never delivered until a restart). Here the outbox
// tries to deliver while every file descriptor is taken; once they are
// free again, the report must still be delivered, exactly once.
func TestReportKeptWhileOutOfOpenFiles(t *testing.T) {
	s := newFakeSender()
	logs := make(chan string, 16)
	o := open(t, t.TempDir(), s, func(c *Config) { c.Logger = slog.New(signalHandler{logs}) })
	put(t, o, "c1", keys("c1", 2))

	release := exhaustFiles(t)
	stop := run(t, o)
	defer stop()
	// Wait until the outbox has met the limit (it logs the failed read).
	var msg string
	select {
	case msg = <-logs:
	case <-time.After(guard):
		release()
		t.Fatal("the outbox never tried to read its entry")
	}
	release()
	if !strings.Contains(msg, "too many open files") {
		t.Fatalf("first outbox log %q, want a read failing with too many open files", msg)
	}
	waitEmpty(t, o)
	if got, want := s.storedOf("c1"), keys("c1", 2); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v (no report may be dropped at the open-files limit)", got, want)
	}
}

// mountTmpfs mounts a tmpfs of size bytes at a temp dir for the test (the
// tests run as root), so a write can meet a real full disk (ENOSPC).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for a full disk (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	return dir
}

// fill writes a file into dir until the disk is full and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the disk: %v", err)
			}
			return path
		}
	}
}

// TestPutOnAFullDiskStoresNothingAndKeepsTheQueue: a Put that meets a full
// disk fails with ENOSPC and leaves no partial file, the reports stored
// before are all delivered, and once there is room Put works again.
func TestPutOnAFullDiskStoresNothingAndKeepsTheQueue(t *testing.T) {
	dir := mountTmpfs(t, "1m")
	s := newFakeSender()
	o := open(t, dir, s, nil)
	put(t, o, "c1", keys("c1", 3))
	filler := fill(t, dir)

	big := make([]byte, 8<<10) // more than the tmpfs's last free bytes
	for i := range big {
		big[i] = 'x'
	}
	_, err := o.Put("c1", "POST", "/r", "c1:big", []byte(`{"k":"`+string(big)+`"}`))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Put on a full disk: %v, want ENOSPC", err)
	}
	if n, _ := o.Len(); n != 3 {
		t.Fatalf("outbox holds %d entries after the failed Put, want 3", n)
	}
	files, _ := os.ReadDir(filepath.Join(dir, "queue", "c1"))
	for _, f := range files {
		if strings.Contains(f.Name(), ".tmp-") {
			t.Errorf("partial file %s left behind by the failed Put", f.Name())
		}
	}

	stop := run(t, o)
	defer stop()
	waitEmpty(t, o)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	put(t, o, "c1", []string{"c1:3"})
	waitEmpty(t, o)
	if got, want := s.storedOf("c1"), keys("c1", 4); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}
