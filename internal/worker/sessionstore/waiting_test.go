package sessionstore

import (
	"slices"
	"testing"
)

// TestWaitingIndexFollowsTheState checks that the waiting index names
// exactly the conversations whose stored state has work, so that the
// periodic takeover pass can read it instead of every state file.
func TestWaitingIndexFollowsTheState(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() []string {
		t.Helper()
		ids, err := s.ListWaiting()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(ids)
		return ids
	}
	idle := &Meta{ConversationID: "idle", UserID: "u"}
	queued := &Meta{ConversationID: "queued", UserID: "u", Pending: []PendingMessage{{ClientMessageID: "m1", Text: "hi"}}}
	running := &Meta{ConversationID: "running", UserID: "u", Turn: &PendingMessage{ClientMessageID: "m2", Text: "hi"}}
	for _, m := range []*Meta{idle, queued, running} {
		if err := s.SaveMeta(m); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := waiting(), []string{"queued", "running"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	running.Turn = nil
	if err := s.SaveMeta(running); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("queued"); err != nil {
		t.Fatal(err)
	}
	if got := waiting(); len(got) != 0 {
		t.Fatalf("got %v after the turn ended and the queued conversation was deleted, want none", got)
	}
}
