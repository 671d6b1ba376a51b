package reportfeed

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// TestFullDiskHoldsNoReportBack: reports do not wait for the disk. With the
// cursors' disk full, every report is still delivered; the cursor is saved
// once there is room again, and a restart then sends nothing twice. (When
// reports went through fsynced outbox files, a full disk stopped them.)
func TestFullDiskHoldsNoReportBack(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	appendN(t, store, "c1", 4)
	small := filepath.Join(dir, "small")
	os.Mkdir(small, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", small).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for a full disk (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", small).Run() })
	cursors := filepath.Join(small, "cursors")
	os.Mkdir(cursors, 0o700)
	filler := filepath.Join(small, "filler")
	f, _ := os.Create(filler)
	for {
		if _, err := f.Write(make([]byte, 4<<10)); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	rec := &recorder{}
	var errs atomicCount
	feed, err := New(Config{Sender: rec, Logs: logs{store}, List: store.List, Dir: cursors, Logger: slog.New(errorSignal{errs.add})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { feed.Run(ctx); close(done) }()
	rec.waitKeys(t, 4)
	cancel()
	<-done // Run saves its cursors as it ends: the disk is full
	if errs.load() == 0 {
		t.Fatal("saving the cursor on a full disk logged no error")
	}
	if _, err := os.Stat(filepath.Join(cursors, "c1.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a cursor file on a full disk: %v", err)
	}
	os.Remove(filler)
	// The next run sends again what it cannot know was sent, then saves.
	_, stop := startFeed(t, small, store, rec, nil)
	waitFile(t, filepath.Join(cursors, "c1.json"))
	stop()
	b, _ := os.ReadFile(filepath.Join(cursors, "c1.json"))
	var c cursorFile
	if json.Unmarshal(b, &c) != nil || c.EventID != 4 {
		t.Fatalf("cursor %s, want event 4", b)
	}
	sent := rec.requests
	_, stop = startFeed(t, small, store, rec, nil)
	time.Sleep(3 * linger)
	stop()
	if rec.requests != sent {
		t.Errorf("a restart with a saved cursor sent %d requests", rec.requests-sent)
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never written", path)
		}
	}
}

// atomicCount counts calls of add.
type atomicCount struct{ n atomic.Int64 }

func (c *atomicCount) add()        { c.n.Add(1) }
func (c *atomicCount) load() int64 { return c.n.Load() }

// errorSignal is a slog handler that calls f for every error record.
type errorSignal struct{ f func() }

func (h errorSignal) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h errorSignal) Handle(context.Context, slog.Record) error    { h.f(); return nil }
func (h errorSignal) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h errorSignal) WithGroup(string) slog.Handler                { return h }
