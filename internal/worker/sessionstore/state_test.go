package sessionstore

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// saveSessions saves m once per session id, in order.
func saveSessions(t *testing.T, s *Store, m *Meta, sessions ...string) {
	t.Helper()
	for _, id := range sessions {
		m.SessionID = id
		if err := s.SaveMeta(m); err != nil {
			t.Fatalf("save %s: %v", id, err)
		}
	}
}

func loadSession(t *testing.T, s *Store, conv string) string {
	t.Helper()
	m, err := s.LoadMeta(conv)
	if err != nil {
		t.Fatalf("load %s: %v", conv, err)
	}
	return m.SessionID
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// TestSavesWriteInPlace: after a conversation's first two saves, a save
// creates, renames and resizes nothing: it writes one slot file in place
// (a save replaced the file before, which cost five times as much).
func TestSavesWriteInPlace(t *testing.T) {
	s := openStore(t)
	m := &Meta{ConversationID: "c1", UserID: "u"}
	m.Accept("m1", strings.Repeat("long text ", 50))
	saveSessions(t, s, m, "s1", "s2")
	dir := s.Dir("c1")
	names := dirNames(t, dir)
	inodes := map[string]uint64{}
	sizes := map[string]int64{}
	for _, name := range []string{"state.json", "state.0.json", "state.1.json"} {
		inodes[name] = inode(t, filepath.Join(dir, name))
		st, _ := os.Stat(filepath.Join(dir, name))
		sizes[name] = st.Size()
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", name, st.Mode().Perm())
		}
	}
	m.AcceptedMessages = nil // the state shrinks, a little
	saveSessions(t, s, m, "s3", "s4", "s5")
	for name, ino := range inodes {
		if got := inode(t, filepath.Join(dir, name)); got != ino {
			t.Errorf("%s was replaced (inode %d, was %d)", name, got, ino)
		}
		if st, _ := os.Stat(filepath.Join(dir, name)); st.Size() != sizes[name] {
			t.Errorf("%s changed size: %d, was %d", name, st.Size(), sizes[name])
		}
	}
	if got := dirNames(t, dir); got != names {
		t.Errorf("files: %s, want %s", got, names)
	}
	if got := loadSession(t, s, "c1"); got != "s5" {
		t.Errorf("loaded session %s, want s5", got)
	}
	// A state far smaller than its slot's file is not padded forever.
	m.Accept("m2", strings.Repeat("x", 64<<10))
	saveSessions(t, s, m, "s6", "s7")
	m.AcceptedMessages = nil
	saveSessions(t, s, m, "s8", "s9")
	for _, name := range []string{"state.0.json", "state.1.json"} {
		if st, _ := os.Stat(filepath.Join(dir, name)); st.Size() > slotSlack {
			t.Errorf("%s holds %d bytes after its state shrank below 1 KB", name, st.Size())
		}
	}
	if got := loadSession(t, s, "c1"); got != "s9" {
		t.Errorf("loaded session %s, want s9", got)
	}
}

// TestATornSaveLoadsTheSaveBefore: a save cut by a crash (its slot torn
// or cut short) loads as the save before it, and the next save does not
// write over that one.
func TestATornSaveLoadsTheSaveBefore(t *testing.T) {
	tears := map[string]func(path string) error{
		"bytes in the middle": func(path string) error {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("ZZZZ"), 40)
			return err
		},
		"cut short": func(path string) error {
			st, err := os.Stat(path)
			if err != nil {
				return err
			}
			return os.Truncate(path, st.Size()/2)
		},
		"zeroed": func(path string) error {
			st, err := os.Stat(path)
			if err != nil {
				return err
			}
			return os.WriteFile(path, make([]byte, st.Size()), 0o600)
		},
		// A state whose JSON still parses: only the checksum tells.
		"a changed value": func(path string) error {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(path, []byte(strings.Replace(string(b), `"session_id":"`, `"session_id":"x`, 1)), 0o600)
		},
	}
	for name, tear := range tears {
		t.Run(name, func(t *testing.T) {
			s := openStore(t)
			m := &Meta{ConversationID: "c1", UserID: "u"}
			saveSessions(t, s, m, "s1", "s2", "s3") // s3 is save 3: slot 1
			if err := tear(filepath.Join(s.Dir("c1"), "state.1.json")); err != nil {
				t.Fatal(err)
			}
			got, err := s.LoadMeta("c1")
			if err != nil {
				t.Fatalf("load after a torn save: %v", err)
			}
			if got.SessionID != "s2" {
				t.Fatalf("loaded session %s, want s2 (the save before the torn one)", got.SessionID)
			}
			// The next save goes over the torn slot, never over s2's.
			got.SessionID = "s4"
			if err := s.SaveMeta(got); err != nil {
				t.Fatal(err)
			}
			if err := tear(filepath.Join(s.Dir("c1"), "state.1.json")); err != nil {
				t.Fatal(err)
			}
			if got := loadSession(t, s, "c1"); got != "s2" {
				t.Errorf("after the next save was torn too: loaded %s, want s2", got)
			}
		})
	}
	t.Run("both slots", func(t *testing.T) {
		s := openStore(t)
		saveSessions(t, s, &Meta{ConversationID: "c1", UserID: "u"}, "s1", "s2")
		for _, name := range []string{"state.0.json", "state.1.json"} {
			if err := tears["cut short"](filepath.Join(s.Dir("c1"), name)); err != nil {
				t.Fatal(err)
			}
		}
		_, err := s.LoadMeta("c1")
		if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "neither state slot is intact") {
			t.Errorf("load with both slots torn: %v, want an error naming them", err)
		}
	})
}

// TestFormat1StateMovesToSlots: a state.json of the format before slots
// (the whole state) loads, and its first save moves it to slots.
func TestFormat1StateMovesToSlots(t *testing.T) {
	s := openStore(t)
	if err := os.MkdirAll(s.Dir("c1"), 0o700); err != nil {
		t.Fatal(err)
	}
	old := `{"format":1,"conversation_id":"c1","user_id":"u","session_id":"old","accepted_messages":["m1"]}`
	if err := os.WriteFile(filepath.Join(s.Dir("c1"), "state.json"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := s.LoadMeta("c1")
	if err != nil {
		t.Fatal(err)
	}
	if seen, _ := m.HasAccepted("m1", "x"); m.SessionID != "old" || !seen {
		t.Fatalf("format 1 state: %+v", m)
	}
	saveSessions(t, s, m, "new")
	var head marker
	b, _ := os.ReadFile(filepath.Join(s.Dir("c1"), "state.json"))
	if err := json.Unmarshal(b, &head); err != nil || head.Format != StateFormat || strings.Contains(string(b), "old") {
		t.Errorf("state.json after the first save: %s", b)
	}
	if got := loadSession(t, s, "c1"); got != "new" {
		t.Errorf("loaded session %s, want new", got)
	}
	// A worker of format 1 refuses the marker rather than read it as an
	// empty state.
	var v1 Meta
	if json.Unmarshal(b, &v1) != nil || v1.Format == FormatVersion {
		t.Errorf("the marker reads as format 1: %s", b)
	}
}

// TestSlotsWithoutAMarkerAreNoState: slots whose marker was never written
// (a crash during a conversation's first save) or was removed (a deleted
// conversation) are not a conversation, and do not come back as one under
// the same id.
func TestSlotsWithoutAMarkerAreNoState(t *testing.T) {
	s := openStore(t)
	saveSessions(t, s, &Meta{ConversationID: "c1", UserID: "u"}, "s1", "s2", "s3")
	stale, err := os.ReadFile(filepath.Join(s.Dir("c1"), "state.1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveState("c1"); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, s.Dir("c1")); names != "" {
		t.Errorf("files after RemoveState: %s", names)
	}
	// As a crash could leave them: the marker gone, a slot still there.
	if err := os.WriteFile(filepath.Join(s.Dir("c1"), "state.1.json"), stale, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadMeta("c1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("load without a marker: %v, want ErrNotFound", err)
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Errorf("List: %v, want none", ids)
	}
	// Created again: its first save is the newest, even against the stale
	// slot's higher save number, and stays so when the next one is torn.
	saveSessions(t, s, &Meta{ConversationID: "c1", UserID: "u2"}, "fresh")
	m, err := s.LoadMeta("c1")
	if err != nil || m.SessionID != "fresh" || m.UserID != "u2" {
		t.Fatalf("conversation created again: %+v, %v", m, err)
	}
	saveSessions(t, s, m, "fresh2")
	if err := os.Truncate(filepath.Join(s.Dir("c1"), "state.1.json"), 10); err != nil {
		t.Fatal(err)
	}
	if got := loadSession(t, s, "c1"); got != "fresh" {
		t.Errorf("after a torn second save: loaded %s, want fresh", got)
	}
}

// TestSlotsOfAnotherConversationAreRefused: slots copied from another
// conversation under this one's marker would be saved back into theirs.
func TestSlotsOfAnotherConversationAreRefused(t *testing.T) {
	s := openStore(t)
	saveSessions(t, s, &Meta{ConversationID: "c1", UserID: "u"}, "s1", "s2")
	saveSessions(t, s, &Meta{ConversationID: "c2", UserID: "u"}, "t1", "t2")
	for _, name := range []string{"state.0.json", "state.1.json"} {
		b, err := os.ReadFile(filepath.Join(s.Dir("c1"), name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.Dir("c2"), name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.LoadMeta("c2"); err == nil || !strings.Contains(err.Error(), `names conversation "c1"`) {
		t.Errorf("slots of c1 loaded as c2's: err %v", err)
	}
}

// TestSaveFollowsNoLink: a slot that is a symbolic link is not written
// through, and the save fails.
func TestSaveFollowsNoLink(t *testing.T) {
	s := openStore(t)
	m := &Meta{ConversationID: "c1", UserID: "u"}
	saveSessions(t, s, m, "s1", "s2")
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	slot := filepath.Join(s.Dir("c1"), "state.1.json")
	if err := os.Remove(slot); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, slot); err != nil {
		t.Fatal(err)
	}
	m.SessionID = "s3"
	if err := s.SaveMeta(m); err == nil {
		t.Error("a save through a link succeeded")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("the link's target was written: %q", b)
	}
	if got := loadSession(t, s, "c1"); got != "s2" {
		t.Errorf("loaded %s, want s2", got)
	}
}

// TestAnUnreadableSlotIsAnError: a slot that exists but cannot be read
// (too many open files, EIO, a stale NFS handle; here a directory in its
// place) is not a torn one: taking the other slot would load an older
// state, and the next save would overwrite the newest.
func TestAnUnreadableSlotIsAnError(t *testing.T) {
	s := openStore(t)
	m := &Meta{ConversationID: "c1", UserID: "u"}
	saveSessions(t, s, m, "s1", "s2", "s3") // s3 in slot 1
	slot := filepath.Join(s.Dir("c1"), "state.1.json")
	if err := os.Rename(slot, slot+".aside"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(slot, 0o700); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadMeta("c1"); err == nil {
		t.Fatalf("loaded session %s with the newest slot unreadable, want an error", got.SessionID)
	}
	// A new Meta's first save reads the slots too: it must not go on.
	if err := s.SaveMeta(&Meta{ConversationID: "c1", UserID: "u", SessionID: "other"}); err == nil {
		t.Error("a save with a slot unreadable succeeded")
	}
	if err := os.Remove(slot); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(slot+".aside", slot); err != nil {
		t.Fatal(err)
	}
	if got := loadSession(t, s, "c1"); got != "s3" {
		t.Errorf("loaded %s once readable, want s3", got)
	}
}

// TestASaveAfterItsStateWasRemovedFails: once RemoveState took the marker
// (a Delete that failed after it leaves the session loaded), a save must
// not report success for a slot nothing reads.
func TestASaveAfterItsStateWasRemovedFails(t *testing.T) {
	s := openStore(t)
	m := &Meta{ConversationID: "c1", UserID: "u"}
	saveSessions(t, s, m, "s1", "s2")
	if err := s.RemoveState("c1"); err != nil {
		t.Fatal(err)
	}
	m.SessionID = "s3"
	if err := s.SaveMeta(m); !errors.Is(err, ErrNotFound) {
		t.Errorf("save after RemoveState: %v, want ErrNotFound", err)
	}
	if _, err := s.LoadMeta("c1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("load after RemoveState: %v, want ErrNotFound", err)
	}
}

// TestSaveRefusesAnIDThatIsAPath: an id naming a directory other than its
// own under the conversations' is refused, and nothing is written there.
func TestSaveRefusesAnIDThatIsAPath(t *testing.T) {
	s := openStore(t)
	for _, id := range []string{"..", "../escaped", "a/b"} {
		if err := s.SaveMeta(&Meta{ConversationID: id, UserID: "u"}); err == nil || !strings.Contains(err.Error(), "not a conversation id") {
			t.Errorf("save of id %q: %v, want a refusal", id, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.root, "escaped")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a save wrote outside the conversations: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir("a"), "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a save wrote a nested conversation: %v", err)
	}
}
