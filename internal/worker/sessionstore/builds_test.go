package sessionstore

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Build records survive a reopen, a record whose content names another
// file than its own (written by hand, or a tampered volume) is skipped and
// named, ids that are not names are refused, and a conversation's records
// go with its state.
func TestBuildRecords(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []BuildRecord{
		{Conversation: "c1", ID: "toolu_a", Runner: "local", Tasks: []string{"test"}, UID: 20001, Started: time.Now().UTC()},
		{Conversation: "c1", ID: "toolu_b", Runner: "local", Tasks: []string{"build"}, UID: 20001},
		{Conversation: "c10", ID: "toolu_a", Runner: "local", Tasks: []string{"test"}, UID: 20002},
	} {
		if err := s.PutBuild(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []BuildRecord{{Conversation: "../c1", ID: "x"}, {Conversation: "c1", ID: "../../state"}, {Conversation: "c1", ID: ""}} {
		if err := s.PutBuild(bad); err == nil {
			t.Errorf("record %+v taken", bad)
		}
	}
	// A record claiming to be another conversation's build.
	if err := os.WriteFile(filepath.Join(dir, "builds", "c2.toolu_x.json"), []byte(`{"conversation":"c1","id":"toolu_a"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "builds", "c3.toolu_y.json"), []byte(`{not json`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ = Open(dir)
	recs, bad, err := s.ListBuilds()
	if err != nil || len(recs) != 3 || len(bad) != 2 {
		t.Fatalf("records %+v, bad %v, %v", recs, bad, err)
	}
	if err := s.RemoveState("c1"); err != nil {
		t.Fatal(err)
	}
	recs, _, _ = s.ListBuilds()
	if len(recs) != 1 || recs[0].Conversation != "c10" {
		t.Errorf("after c1's state was removed: %+v; want only c10's", recs)
	}
	if err := s.RemoveBuild("c10", "toolu_a"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveBuild("c10", "toolu_a"); err != nil {
		t.Errorf("removing a record twice: %v", err)
	}
	if recs, _, _ = s.ListBuilds(); len(recs) != 0 {
		t.Errorf("records left: %+v", recs)
	}
}
