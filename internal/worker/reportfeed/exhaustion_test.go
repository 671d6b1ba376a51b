package reportfeed

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/worker/outbox"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// TestFeedRetriesAfterAFullDisk guards against reports left behind: a
// catch-up whose Put met a full disk was logged and not tried again until
// the conversation's next event. Here the outbox's disk is full when the
// feed starts; once space is freed, every report arrives with no new event.
func TestFeedRetriesAfterAFullDisk(t *testing.T) {
	dir := t.TempDir()
	store, _ := sessionstore.Open(filepath.Join(dir, "store"))
	el, _, _ := store.OpenEventLog("c1")
	store.SaveMeta(&sessionstore.Meta{ConversationID: "c1"})
	for _, ev := range sampleEvents("c1")[:4] {
		el.Append(ev)
	}
	small := filepath.Join(dir, "small")
	os.Mkdir(small, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", small).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for a full disk (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", small).Run() })
	rec := &recorder{}
	ob, err := outbox.Open(outbox.Config{Dir: filepath.Join(small, "outbox"), Sender: rec, MinBackoff: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
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
	failed := make(chan struct{})
	var once sync.Once
	feed, err := New(Config{Outbox: ob, Logs: logs{store}, List: store.List, Dir: filepath.Join(dir, "cursors"),
		Logger: slog.New(errorSignal{func() { once.Do(func() { close(failed) }) }})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { ob.Run(ctx) })
	wg.Go(func() { feed.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	select {
	case <-failed: // the catch-up met the full disk
	case <-time.After(30 * time.Second):
		t.Fatal("the feed never met the full disk")
	}
	if n, _ := ob.Len(); n > 0 {
		t.Fatal("the outbox took a report on a full disk")
	}
	os.Remove(filler)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		rec.mu.Lock()
		got := len(rec.keys)
		rec.mu.Unlock()
		if got >= 5 { // 4 activity + 1 tool
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d reports after space was freed, want 5 (with no new event)", got)
		}
	}
}

// errorSignal is a slog handler that calls f for every error record.
type errorSignal struct{ f func() }

func (h errorSignal) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h errorSignal) Handle(context.Context, slog.Record) error    { h.f(); return nil }
func (h errorSignal) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h errorSignal) WithGroup(string) slog.Handler                { return h }
