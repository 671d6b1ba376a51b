package worker

import (
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

func TestFDBudgetKeepsTheReserveAndSplitsTheRest(t *testing.T) {
	b := newFDBudget(1024, 20, 4)
	if b.Reserved != 20+transientFiles+4*perProcessFiles {
		t.Errorf("reserved %d, want open + transient + per process", b.Reserved)
	}
	if got := b.Reserved + b.MaxConns + b.MaxLoaded; got != b.Limit {
		t.Errorf("reserved + connections + conversations = %d, want the limit %d", got, b.Limit)
	}
	if b.MaxStreams != b.MaxConns/2 {
		t.Errorf("streams %d, want half of the connections %d", b.MaxStreams, b.MaxConns)
	}
}

// wantRefusal checks that err is a 503 unavailable with Retry-After.
func wantRefusal(t *testing.T, what string, err error) {
	t.Helper()
	var he *httpapi.Error
	if !errors.As(err, &he) || he.Status != http.StatusServiceUnavailable || he.Type != contract.ErrTypeUnavailable || he.Header.Get("Retry-After") == "" {
		t.Errorf("%s: got %v, want 503 unavailable with Retry-After", what, err)
	}
}

func TestAdmissionRefusesNearTheLimits(t *testing.T) {
	b := newFDBudget(1024, 20, 4)
	open, live := 100, 0
	a := newAdmission(b, 4, func() int { return live }, func() int { return open }, t.TempDir(), -1)
	if err := a.check(); err != nil {
		t.Fatalf("check with plenty free: %v", err)
	}
	// The reserve counts the process slots not in use: four free slots
	// need their files kept.
	open = b.Limit - transientFiles - 4*perProcessFiles
	wantRefusal(t, "open files within the reserve", a.check())
	live = 4
	if err := a.check(); err != nil {
		t.Errorf("same files open with every slot in use (their files counted): %v", err)
	}
	open = 100
	wantRefusal(t, "one load beyond the cap", a.admitLoad(b.MaxLoaded))
	if err := a.admitLoad(b.MaxLoaded - 1); err != nil {
		t.Errorf("the last load within the cap: %v", err)
	}
	var releases []func()
	for range b.MaxStreams {
		r, err := a.admitStream()
		if err != nil {
			t.Fatalf("stream within the cap: %v", err)
		}
		releases = append(releases, r)
	}
	_, err := a.admitStream()
	wantRefusal(t, "one stream beyond the cap", err)
	releases[0]()
	if _, err := a.admitStream(); err != nil {
		t.Errorf("a stream after one ended: %v", err)
	}

	a.minFreeDisk = 1 << 62 // more than any disk has free
	wantRefusal(t, "a session volume below its free-space floor", a.check())
}

func TestExhaustionErrorsAreRefusals(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOSPC, syscall.EDQUOT, syscall.ENOMEM} {
		err := fmt.Errorf("store message: save state of c1: %w", errno)
		wantRefusal(t, errno.Error(), mapErr(err))
	}
	if exhaustionError(errors.New("other")) != nil {
		t.Error("an unrelated error mapped to a refusal")
	}
}

// TestOpenFilesCountReused: admission counts open files at most once per
// openFilesTTL however many requests ask, and counts again after it.
func TestOpenFilesCountReused(t *testing.T) {
	calls := 0
	f := cachedFor(time.Hour, func() int { calls++; return calls })
	for range 100 {
		if got := f(); got != 1 {
			t.Fatalf("count %d within the ttl, want the first (1)", got)
		}
	}
	g := cachedFor(time.Nanosecond, func() int { calls++; return calls })
	a := g()
	time.Sleep(time.Millisecond)
	if b := g(); b == a {
		t.Errorf("count not taken again after the ttl")
	}
}
