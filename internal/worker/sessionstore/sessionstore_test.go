package sessionstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
)

func newEvent(t *testing.T, text string) contract.Event {
	t.Helper()
	ev, err := contract.NewEvent("c1", contract.EventAssistantText, contract.AssistantText{Text: text})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestMetaRoundTripAndVersion(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadMeta("c1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: got %v, want ErrNotFound", err)
	}
	m := &Meta{ConversationID: "c1", UserID: "u", SessionID: "s", WorkDir: "/w"}
	m.Accept("m1", "hello")
	if err := s.SaveMeta(m); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadMeta("c1")
	if err != nil {
		t.Fatal(err)
	}
	if seen, same := got.HasAccepted("m1", "hello"); got.SessionID != "s" || !seen || !same {
		t.Errorf("got %+v", got)
	}
	if seen, same := got.HasAccepted("m1", "something else"); !seen || same {
		t.Errorf("m1 with another text: seen %v same %v, want true false", seen, same)
	}
	if seen, _ := got.HasAccepted("m2", "hello"); seen {
		t.Error("m2 reported as accepted")
	}
	st, _ := os.Stat(filepath.Join(s.Dir("c1"), "state.json"))
	if st.Mode().Perm() != 0o600 {
		t.Errorf("state.json mode: got %v, want 0600", st.Mode().Perm())
	}
	os.WriteFile(filepath.Join(s.Dir("c1"), "state.json"), []byte(`{"format":99}`), 0o600)
	if _, err := s.LoadMeta("c1"); !errors.Is(err, ErrFormat) {
		t.Errorf("future format: got %v, want ErrFormat", err)
	}
	ids, err := s.List()
	if err != nil || len(ids) != 1 || ids[0] != "c1" {
		t.Errorf("List: got %v, %v", ids, err)
	}
}

func TestAcceptedMessagesBounded(t *testing.T) {
	var m Meta
	for i := 0; i < MaxAcceptedMessages+5; i++ {
		m.Accept(string(rune('a'+i%26))+time.Duration(i).String(), "x")
	}
	if len(m.AcceptedMessages) != MaxAcceptedMessages {
		t.Errorf("got %d ids, want %d", len(m.AcceptedMessages), MaxAcceptedMessages)
	}
}

func TestEventLogIDsSurviveReopen(t *testing.T) {
	s, _ := Open(t.TempDir())
	l, _, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		ev, err := l.Append(newEvent(t, "x"))
		if err != nil {
			t.Fatal(err)
		}
		if ev.ID != int64(i) || ev.ConversationID != "c1" {
			t.Fatalf("append %d: got id %d conv %q", i, ev.ID, ev.ConversationID)
		}
	}
	l.Close()
	l2, rep, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if rep != (RepairReport{}) {
		t.Errorf("clean log repaired: %+v", rep)
	}
	ev, _ := l2.Append(newEvent(t, "y"))
	if ev.ID != 4 {
		t.Errorf("id after reopen: got %d, want 4", ev.ID)
	}
}

func TestEventLogTornLastRecord(t *testing.T) {
	s, _ := Open(t.TempDir())
	l, _, _ := s.OpenEventLog("c1")
	l.Append(newEvent(t, "a"))
	l.Append(newEvent(t, "b"))
	l.Close()
	path := filepath.Join(s.Dir("c1"), "events.jsonl")
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"id":3,"type":"assistant_te`)
	f.Close()

	l2, rep, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatalf("torn record must not be fatal: %v", err)
	}
	if rep.TornBytes == 0 {
		t.Error("torn record not reported")
	}
	if l2.LastID() != 2 {
		t.Errorf("last id: got %d, want 2", l2.LastID())
	}
	ev, err := l2.Append(newEvent(t, "c"))
	if err != nil || ev.ID != 3 {
		t.Fatalf("append after repair: %v id %d", err, ev.ID)
	}
	l2.Close()
	l3, rep, _ := s.OpenEventLog("c1")
	defer l3.Close()
	evs, _ := l3.Since(0, 10)
	if len(evs) != 3 || rep != (RepairReport{}) {
		t.Errorf("after repair: %d events, report %+v; want 3 and clean", len(evs), rep)
	}
}

func TestEventLogRejectsUnknownVersion(t *testing.T) {
	s, _ := Open(t.TempDir())
	os.MkdirAll(s.Dir("c1"), 0o700)
	os.WriteFile(filepath.Join(s.Dir("c1"), "events.jsonl"), []byte(`{"format":"talkide-eventlog","version":7}`+"\n"), 0o600)
	if _, _, err := s.OpenEventLog("c1"); !errors.Is(err, ErrFormat) {
		t.Errorf("got %v, want ErrFormat", err)
	}
}

func TestSinceFromFileBeyondMemory(t *testing.T) {
	s, _ := Open(t.TempDir())
	s.RecentEvents = 5
	l, _, _ := s.OpenEventLog("c1")
	defer l.Close()
	for i := 0; i < 20; i++ {
		l.Append(newEvent(t, "x"))
	}
	for _, after := range []int64{0, 3, 14, 15, 19, 20} {
		evs, err := l.Since(after, 100)
		if err != nil {
			t.Fatal(err)
		}
		if want := int(20 - after); len(evs) != want {
			t.Fatalf("Since(%d): got %d events, want %d", after, len(evs), want)
		}
		for i, ev := range evs {
			if ev.ID != after+int64(i)+1 {
				t.Fatalf("Since(%d)[%d]: got id %d", after, i, ev.ID)
			}
		}
	}
}

// TestFollowNoLossNoDuplicates runs a writer and several followers, one of
// them slow, and checks every follower sees every id exactly once, in order.
func TestFollowNoLossNoDuplicates(t *testing.T) {
	s, _ := Open(t.TempDir())
	s.RecentEvents = 16 // force the slow follower through the file
	l, _, _ := s.OpenEventLog("c1")
	const n = 300
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	results := make([][]int64, 4)
	for f := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := l.Follow(ctx, 0, 10*time.Millisecond, func(ev contract.Event) error {
				results[f] = append(results[f], ev.ID)
				if f == 0 {
					time.Sleep(200 * time.Microsecond) // the slow one
				}
				return nil
			}, nil)
			if !errors.Is(err, ErrClosed) {
				t.Errorf("follower %d: got %v, want ErrClosed", f, err)
			}
		}()
	}
	for i := 0; i < n; i++ {
		if _, err := l.Append(newEvent(t, "x")); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	wg.Wait()
	for f, ids := range results {
		if len(ids) != n {
			t.Fatalf("follower %d: got %d events, want %d", f, len(ids), n)
		}
		for i, id := range ids {
			if id != int64(i+1) {
				t.Fatalf("follower %d: event %d has id %d", f, i, id)
			}
		}
	}
}

func TestRetentionKeepsTheNewest(t *testing.T) {
	s, _ := Open(t.TempDir())
	s.KeepEvents = 10
	l, _, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if _, err := l.Append(newEvent(t, "x")); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	data, _ := os.ReadFile(filepath.Join(s.Dir("c1"), "events.jsonl"))
	if lines := bytes.Count(data, []byte("\n")) - 1; lines > 15 || lines < 10 {
		t.Errorf("log holds %d events, want 10 to 15", lines)
	}
	l2, _, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	evs, _ := l2.Since(0, 1000)
	if len(evs) < 10 || evs[len(evs)-1].ID != 100 {
		t.Fatalf("after reopening: %d events ending at %d, want at least 10 ending at 100", len(evs), evs[len(evs)-1].ID)
	}
	if ev, _ := l2.Append(newEvent(t, "y")); ev.ID != 101 {
		t.Errorf("next id after compaction: %d, want 101", ev.ID)
	}
}

// TestAppendAllStoresInOrder: events appended together take consecutive
// ids in order, wake a follower once, and read back as appended ones do.
func TestAppendAllStoresInOrder(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(newEvent(t, "zero")); err != nil {
		t.Fatal(err)
	}
	woken, _ := l.changedOrClosed()
	got, err := l.AppendAll([]contract.Event{newEvent(t, "one"), newEvent(t, "two"), newEvent(t, "three")})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	default:
		t.Error("followers not woken")
	}
	if len(got) != 3 || got[0].ID != 2 || got[2].ID != 4 {
		t.Fatalf("stored: %+v", got)
	}
	if none, err := l.AppendAll(nil); err != nil || none != nil || l.LastID() != 4 {
		t.Errorf("append of nothing: %v, %v, last id %d", none, err, l.LastID())
	}
	l.Close()
	l2, rep, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	evs, err := l2.Since(1, 10)
	if err != nil || rep.TornBytes != 0 || len(evs) != 3 {
		t.Fatalf("read back: %d events, %+v, %v", len(evs), rep, err)
	}
	for i, want := range []string{"one", "two", "three"} {
		var at contract.AssistantText
		if json.Unmarshal(evs[i].Data, &at) != nil || at.Text != want || evs[i].ID != int64(i+2) {
			t.Errorf("event %d: id %d %s, want id %d %q", i, evs[i].ID, evs[i].Data, i+2, want)
		}
	}
}

// TestWrittenEventsWaitForTheirCommit: no reader sees events given to
// Write (not Since from memory, not Since from the file beyond memory, not
// another process's reader of the file, not LastID, and followers are not
// woken) until Commit, which stores and publishes them in order with the
// ids Write gave. Discard drops them; AppendAll commits them ahead of its
// own, and Close commits what is left.
func TestWrittenEventsWaitForTheirCommit(t *testing.T) {
	s, _ := Open(t.TempDir())
	s.RecentEvents = 2 // so older reads go to the file
	l, _, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := l.Append(newEvent(t, "stored")); err != nil {
			t.Fatal(err)
		}
	}
	woken, _ := l.changedOrClosed()
	w, err := l.Write([]contract.Event{newEvent(t, "a"), newEvent(t, "b")})
	if err != nil || len(w) != 2 || w[0].ID != 4 || w[1].ID != 5 {
		t.Fatalf("Write: %+v, %v; want ids 4 and 5", w, err)
	}
	if w2, err := l.Write([]contract.Event{newEvent(t, "c")}); err != nil || w2[0].ID != 6 {
		t.Fatalf("second Write: %+v, %v; want id 6", w2, err)
	}
	if l.LastID() != 3 || l.Pending() != 3 {
		t.Fatalf("before the commit: last id %d, pending %d; want 3 and 3", l.LastID(), l.Pending())
	}
	for _, after := range []int64{0, 2} { // from the file, from memory
		if evs, err := l.Since(after, 100); err != nil || len(evs) != int(3-after) {
			t.Fatalf("Since(%d) before the commit: %d events (%v), want %d", after, len(evs), err, 3-after)
		}
	}
	// Another process's reader (a replica's report feed) reads the file.
	other, err := s.OpenEventLogReader("c1")
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := other.Since(0, 100); err != nil || len(evs) != 3 {
		t.Fatalf("another reader before the commit: %d events (%v), want 3", len(evs), err)
	}
	select {
	case <-woken:
		t.Fatal("followers woken before the commit")
	default:
	}
	got, err := l.Commit()
	if err != nil || len(got) != 3 || got[2].ID != 6 {
		t.Fatalf("Commit: %+v, %v", got, err)
	}
	select {
	case <-woken:
	default:
		t.Fatal("followers not woken by the commit")
	}
	if none, err := l.Commit(); none != nil || err != nil {
		t.Fatalf("a second Commit: %v, %v; want nothing", none, err)
	}
	evs, err := l.Since(0, 100)
	if err != nil || len(evs) != 6 || l.LastID() != 6 {
		t.Fatalf("after the commit: %d events, last id %d, %v", len(evs), l.LastID(), err)
	}
	for i, want := range []string{"stored", "stored", "stored", "a", "b", "c"} {
		var at contract.AssistantText
		if json.Unmarshal(evs[i].Data, &at) != nil || at.Text != want || evs[i].ID != int64(i+1) {
			t.Fatalf("event %d: id %d %s, want %q", i, evs[i].ID, evs[i].Data, want)
		}
	}

	if evs, err := other.Since(0, 100); err != nil || len(evs) != 6 {
		t.Fatalf("another reader after the commit: %d events (%v), want 6", len(evs), err)
	}

	// Discard drops what Write kept: its ids are used again.
	if _, err := l.Write([]contract.Event{newEvent(t, "dropped")}); err != nil {
		t.Fatal(err)
	}
	if d := l.Discard(); len(d) != 1 || d[0].ID != 7 || l.Pending() != 0 {
		t.Fatalf("Discard: %+v, pending %d", d, l.Pending())
	}

	// AppendAll publishes what was written before it, ahead of its own.
	if _, err := l.Write([]contract.Event{newEvent(t, "d")}); err != nil {
		t.Fatal(err)
	}
	got, err = l.AppendAll([]contract.Event{newEvent(t, "e")})
	if err != nil || len(got) != 2 || got[0].ID != 7 || got[1].ID != 8 || l.LastID() != 8 {
		t.Fatalf("AppendAll after a Write: %+v, %v, last id %d", got, err, l.LastID())
	}

	// Append returns its own event, not one Write kept before it.
	if _, err := l.Write([]contract.Event{newEvent(t, "kept")}); err != nil {
		t.Fatal(err)
	}
	if got, err := l.Append(newEvent(t, "mine")); err != nil || got.ID != 10 || !strings.Contains(string(got.Data), "mine") {
		t.Fatalf("Append after a Write: id %d %s, %v; want id 10, its own", got.ID, got.Data, err)
	}

	// Close commits what is pending: a reopened log has it.
	if _, err := l.Write([]contract.Event{newEvent(t, "f")}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, rep, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if l2.LastID() != 11 || rep.TornBytes != 0 || rep.BadRecords != 0 {
		t.Fatalf("reopened: last id %d, %+v; want 11, clean", l2.LastID(), rep)
	}
}
