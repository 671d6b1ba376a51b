package sessionstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/atomicfile"
)

// The builds index holds one file, <root>/builds/<conversation>.<build>.json,
// per build a conversation waits for (a build Job or a local build the
// agent's build tool started). It is written, durably, before the
// build starts and removed once its build_completed event is stored, so
// after a worker restart the builds whose results were not delivered are
// exactly the index (ListBuilds): the worker follows them again, delivers
// their results, and deletes any build Job the index does not name. A
// conversation's entries go with its state (RemoveState).

// BuildRecord is a build a conversation waits for.
type BuildRecord struct {
	Conversation string `json:"conversation"`
	// ID is the build's id within the conversation (the tool call's id).
	ID string `json:"id"`
	// Runner is where it runs: "kubernetes" or "local".
	Runner string   `json:"runner"`
	Tasks  []string `json:"tasks"`
	Tests  string   `json:"tests,omitempty"`
	// UID is the agent uid the build runs as and its reports belong to.
	UID     int64     `json:"uid"`
	Started time.Time `json:"started"`
}

var buildIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func (s *Store) buildsDir() string { return filepath.Join(s.root, "builds") }

func (s *Store) buildPath(conv, id string) (string, error) {
	if err := contract.ValidConversationID(conv); err != nil {
		return "", err
	}
	if !buildIDRe.MatchString(id) {
		return "", fmt.Errorf("build id %q: want letters, digits, - and _", id)
	}
	return filepath.Join(s.buildsDir(), conv+"."+id+".json"), nil
}

// PutBuild records r, durably (written, fsynced, renamed, directory
// fsynced). Errors: an invalid conversation or build id, or the disk's.
func (s *Store) PutBuild(r BuildRecord) error {
	p, err := s.buildPath(r.Conversation, r.ID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.buildsDir(), 0o700); err != nil {
		return fmt.Errorf("record build: %w", err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(p, b, 0o600); err != nil {
		return fmt.Errorf("record build %s of %s: %w", r.ID, r.Conversation, err)
	}
	return nil
}

// RemoveBuild removes the record of conv's build id; a record that does
// not exist is no error.
func (s *Store) RemoveBuild(conv, id string) error {
	p, err := s.buildPath(conv, id)
	if err != nil {
		return err
	}
	if err := os.Remove(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("remove build record: %w", err)
	}
	return syncDir(s.buildsDir())
}

// HasBuild reports whether conv's build id is recorded.
func (s *Store) HasBuild(conv, id string) (bool, error) {
	p, err := s.buildPath(conv, id)
	if err != nil {
		return false, err
	}
	_, err = os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// ListBuilds returns every recorded build, of all conversations. A record
// that cannot be read or names another file than its own is skipped and
// reported in bad (its file name).
func (s *Store) ListBuilds() (out []BuildRecord, bad []string, err error) {
	entries, err := os.ReadDir(s.buildsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list builds: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.buildsDir(), name))
		var r BuildRecord
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if p, perr := s.buildPath(r.Conversation, r.ID); err != nil || perr != nil || filepath.Base(p) != name {
			bad = append(bad, name)
			continue
		}
		out = append(out, r)
	}
	return out, bad, nil
}

// removeBuildsOf removes every build record of conv.
func (s *Store) removeBuildsOf(conv string) error {
	matches, err := filepath.Glob(filepath.Join(s.buildsDir(), conv+".*.json"))
	if err != nil {
		return err
	}
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
