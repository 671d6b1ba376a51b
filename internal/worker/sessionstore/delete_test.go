package sessionstore

import (
	"errors"
	"os"
	"testing"
)

func TestDeleteRemovesStateFirstThenEverything(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SaveMeta(&Meta{ConversationID: "c1", UserID: "u1"}); err != nil {
		t.Fatal(err)
	}
	l, _, err := s.OpenEventLog("c1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveState("c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadMeta("c1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after RemoveState: LoadMeta got %v, want ErrNotFound", err)
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Errorf("after RemoveState: List got %v", ids)
	}
	l.Close()
	if err := s.Delete("c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Dir("c1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the conversation's directory survives Delete: %v", err)
	}
	if err := s.Delete("c1"); err != nil {
		t.Errorf("deleting a missing conversation: %v", err)
	}
	for _, bad := range []string{"../x", "a/b", ""} {
		if err := s.Delete(bad); err == nil {
			t.Errorf("Delete(%q): want an error", bad)
		}
	}
}
