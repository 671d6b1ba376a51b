package harness

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sessionstore"
)

// A worker told to stop while a turn runs waits ShutdownGrace for it (5 s
// here, longer than the rig's 3 s lease), then interrupts it: the turn's
// end is stored, as is everything written during the shutdown. Issue 28
// saw a SIGTERM restart drop seven events as "no longer owned", a turn's
// turn_failed among them: the replica lease was no longer renewed once
// the shutdown began, so its trust ran out while running turns were
// waited for.
func TestShutdownLongerThanTheLeaseDropsNoEvent(t *testing.T) {
	vol := t.TempDir()
	r := startRig(t, rigOptions{volume: vol, shutdownGrace: 5 * time.Second})
	mustCreate(t, r.h, "c1")
	e := r.follow(t, "c1")
	mustSend(t, r.h, "c1", "m1", "please run `echo waiting; sleep 60; echo slept`")
	waitEvent(t, e, contract.EventToolUse, 0, 60*time.Second)
	r.stop()

	store, err := sessionstore.Open(filepath.Join(vol, "talkide"))
	if err != nil {
		t.Fatal(err)
	}
	log, err := store.OpenEventLogReader("c1")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	evs, err := log.Since(0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	started, ended := 0, 0
	var types []contract.EventType
	for _, ev := range evs {
		types = append(types, ev.Type)
		switch ev.Type {
		case contract.EventTurnStarted:
			started++
		case contract.EventTurnCompleted, contract.EventTurnFailed:
			ended++
		}
	}
	t.Logf("stored: %v", types)
	if started != 1 || ended != 1 {
		t.Fatalf("stored events %v: %d turns started, %d ended; want the interrupted turn's end stored", types, started, ended)
	}
}
