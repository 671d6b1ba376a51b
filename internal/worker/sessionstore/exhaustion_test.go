package sessionstore

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
)

// fullDisk returns a store on a small tmpfs (the tests run as root) and a
// function that fills the tmpfs until writes fail with ENOSPC; the function
// it returns frees the space again.
func fullDisk(t *testing.T) (s *Store, fill func() (free func())) {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs for a full disk (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, func() func() {
		path := filepath.Join(dir, "filler")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 4<<10)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill the disk: %v", err)
				}
				return func() { os.Remove(path) }
			}
		}
	}
}

// TestSaveMetaOnAFullDiskKeepsThePreviousState guards W2's "state saves
// answered 500": a save that meets a full disk fails with ENOSPC (which the
// worker answers as a refusal) and is never half-done: the previous state
// still loads and no file the save created stays.
func TestSaveMetaOnAFullDiskKeepsThePreviousState(t *testing.T) {
	s, fill := fullDisk(t)
	// saves is how many saves come before the disk fills: the failed save
	// creates the second slot (1) or writes over the older slot in place (3).
	for _, saves := range []int{1, 3} {
		t.Run(fmt.Sprintf("after %d saves", saves), func(t *testing.T) {
			conv := fmt.Sprintf("c%d", saves)
			m := &Meta{ConversationID: conv, UserID: "u1", SessionID: "s1", WorkDir: "/w", CreatedAt: time.Now().UTC()}
			for range saves {
				if err := s.SaveMeta(m); err != nil {
					t.Fatal(err)
				}
			}
			before := dirNames(t, s.Dir(conv))
			free := fill()
			defer free()
			m.Pending = append(m.Pending, PendingMessage{ClientMessageID: "m1", Text: strings.Repeat("x", 64<<10)})
			if err := s.SaveMeta(m); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("SaveMeta on a full disk: %v, want ENOSPC", err)
			}
			got, err := s.LoadMeta(conv)
			if err != nil {
				t.Fatalf("load the state after a failed save: %v", err)
			}
			if len(got.Pending) != 0 || got.SessionID != "s1" {
				t.Fatalf("state after a failed save: %+v, want the previous one", got)
			}
			if after := dirNames(t, s.Dir(conv)); after != before {
				t.Errorf("files after the failed save: %s, want those before it: %s", after, before)
			}
			free()
			if err := s.SaveMeta(m); err != nil {
				t.Fatalf("save once there is room: %v", err)
			}
			if got, err := s.LoadMeta(conv); err != nil || len(got.Pending) != 1 {
				t.Fatalf("state after the retried save: %+v, %v", got, err)
			}
		})
	}
}

// dirNames lists the names in dir, sorted, for comparison.
func dirNames(t *testing.T, dir string) string {
	t.Helper()
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name())
	}
	return strings.Join(names, " ")
}

// TestAppendOnAFullDiskLeavesTheLogWellFormed: an event that does not fit
// is not stored and uses no id; the log stays readable and the next
// append, once there is room, takes the next id.
func TestAppendOnAFullDiskLeavesTheLogWellFormed(t *testing.T) {
	s, fill := fullDisk(t)
	l, _, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	ev := func(text string) contract.Event {
		e, err := contract.NewEvent("c1", contract.EventAssistantText, contract.AssistantText{Text: text})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if _, err := l.Append(ev("one")); err != nil {
		t.Fatal(err)
	}
	free := fill()
	if _, err := l.Append(ev(strings.Repeat("x", 64<<10))); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk: %v, want ENOSPC", err)
	}
	// Several at once, the first of which fits: none is stored.
	if _, err := l.AppendAll([]contract.Event{ev("fits"), ev(strings.Repeat("y", 64<<10))}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append of two on a full disk: %v, want ENOSPC", err)
	}
	// Kept by Write, refused at their Commit: returned with the error, none
	// stored.
	if _, err := l.Write([]contract.Event{ev("kept"), ev(strings.Repeat("z", 64<<10))}); err != nil {
		t.Fatalf("Write on a full disk (nothing is written yet): %v", err)
	}
	if dropped, err := l.Commit(); !errors.Is(err, syscall.ENOSPC) || len(dropped) != 2 || l.Pending() != 0 {
		t.Fatalf("Commit on a full disk: %d events back, %v, pending %d; want 2, ENOSPC, 0", len(dropped), err, l.Pending())
	}
	if evs, _ := l.Since(0, 10); len(evs) != 1 || l.LastID() != 1 {
		t.Fatalf("events after the failed appends: %d (last id %d), want only the first", len(evs), l.LastID())
	}
	free()
	got, err := l.Append(ev("two"))
	if err != nil || got.ID != 2 {
		t.Fatalf("append once there is room: id %d, %v; want id 2", got.ID, err)
	}
	l.Close()
	l2, rep, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if rep.TornBytes != 0 || rep.BadRecords != 0 || l2.LastID() != 2 {
		t.Fatalf("reopened log: %+v, last id %d; want a clean log ending at 2", rep, l2.LastID())
	}
}
