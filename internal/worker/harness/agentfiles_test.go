package harness

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/worker/agentfs"
)

// TestReadTranscriptRefusesWhatTheAgentPlants puts, where the worker looks
// for a session's transcript, each thing an agent can put there, and wants
// readTranscript to return at once, with bounded memory, never following
// a link: the file is found but refused, and the session starts afresh.
func TestReadTranscriptRefusesWhatTheAgentPlants(t *testing.T) {
	const sid = "0b6c4ad5-0000-4000-8000-000000000001"
	const conv = "conv-1"
	uid := os.Geteuid()
	if uid == 0 {
		uid = 200321 // the agent's files are the agent's
	}
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "master-key")
	if err := os.WriteFile(secret, []byte(`{"type":"assistant"}`+"\n"+`{"type":"cost-state","totalCostUSD":99}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustDo := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	valid := `{"type":"user"}` + "\n" + `{"type":"assistant"}` + "\n" + `{"type":"cost-state","totalCostUSD":0.25}` + "\n"
	cases := []struct {
		name     string
		plant    func(t *testing.T, proj string) // proj: <config>/<conv>/projects/p
		found    bool
		hasTurn  bool
		cost     float64
		refused  error
		needRoot bool
	}{
		{name: "regular transcript", plant: func(t *testing.T, proj string) {
			mustDo(t, os.WriteFile(filepath.Join(proj, sid+".jsonl"), []byte(valid), 0o600))
		}, found: true, hasTurn: true, cost: 0.25},
		{name: "symlink to a root-only file", plant: func(t *testing.T, proj string) {
			mustDo(t, os.Symlink(secret, filepath.Join(proj, sid+".jsonl")))
		}, found: true, refused: agentfs.ErrSymlink},
		{name: "symlink to a FIFO", plant: func(t *testing.T, proj string) {
			mustDo(t, syscall.Mkfifo(filepath.Join(proj, "fifo"), 0o600))
			mustDo(t, os.Symlink(filepath.Join(proj, "fifo"), filepath.Join(proj, sid+".jsonl")))
		}, found: true, refused: agentfs.ErrSymlink},
		{name: "FIFO", plant: func(t *testing.T, proj string) {
			mustDo(t, syscall.Mkfifo(filepath.Join(proj, sid+".jsonl"), 0o600))
		}, found: true, refused: agentfs.ErrNotRegular},
		{name: "symlink as the project directory", plant: func(t *testing.T, proj string) {
			mustDo(t, os.WriteFile(filepath.Join(secretDir, sid+".jsonl"), []byte(valid), 0o600))
			mustDo(t, os.Symlink(secretDir, filepath.Join(filepath.Dir(proj), "q")))
		}, found: true, refused: agentfs.ErrSymlink},
		{name: "symlink as projects/", plant: func(t *testing.T, proj string) {
			projects := filepath.Dir(proj)
			mustDo(t, os.RemoveAll(projects))
			mustDo(t, os.MkdirAll(filepath.Join(secretDir, "p"), 0o700))
			mustDo(t, os.Symlink(secretDir, projects))
		}, found: true, refused: agentfs.ErrSymlink},
		{name: "directory", plant: func(t *testing.T, proj string) {
			mustDo(t, os.Mkdir(filepath.Join(proj, sid+".jsonl"), 0o700))
		}, found: true, refused: agentfs.ErrNotRegular},
		{name: "device", needRoot: true, plant: func(t *testing.T, proj string) {
			mustDo(t, syscall.Mknod(filepath.Join(proj, sid+".jsonl"), syscall.S_IFCHR|0o666, 1<<8|5)) // /dev/zero
		}, found: true, refused: agentfs.ErrNotRegular},
		{name: "hard link to a root-only file", needRoot: true, plant: func(t *testing.T, proj string) {
			mustDo(t, os.Link(secret, filepath.Join(proj, sid+".jsonl")))
		}, found: true, refused: agentfs.ErrOwner},
		{name: "10 GB sparse file", plant: func(t *testing.T, proj string) {
			f, err := os.Create(filepath.Join(proj, sid+".jsonl"))
			mustDo(t, err)
			mustDo(t, f.Truncate(10<<30))
			mustDo(t, f.Close())
		}, found: true, hasTurn: true}, // over the head scan: the CLI (the agent) reads it
		{name: "none", plant: func(t *testing.T, proj string) {}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.needRoot && os.Geteuid() != 0 {
				t.Skip("needs root (mknod, or a file of another owner)")
			}
			cfg := t.TempDir()
			proj := filepath.Join(cfg, conv, "projects", "p")
			mustDo(t, os.MkdirAll(proj, 0o700))
			c.plant(t, proj)
			if os.Geteuid() == 0 {
				// The agent's tree is the agent's (but a hard link's inode
				// stays root's).
				_ = filepath.Walk(filepath.Join(cfg, conv), func(p string, fi os.FileInfo, err error) error {
					if err == nil && !(fi.Mode().IsRegular() && fi.Sys().(*syscall.Stat_t).Nlink > 1) {
						_ = os.Lchown(p, uid, uid)
					}
					return nil
				})
			}
			type result struct {
				found, hasTurn bool
				cost           float64
				err            error
			}
			done := make(chan result, 1)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			go func() {
				var r result
				r.found, r.hasTurn, r.cost, r.err = readTranscript(cfg, conv, sid, uid)
				done <- r
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(20 * time.Second):
				// Unblock a reader stuck on the FIFO so the test ends.
				if f, err := os.OpenFile(filepath.Join(proj, "fifo"), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
				t.Fatal("readTranscript blocked")
			}
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
				t.Errorf("allocated %d bytes, want the read bounded", grew)
			}
			if r.found != c.found || r.hasTurn != c.hasTurn || r.cost != c.cost {
				t.Errorf("got found=%v hasTurn=%v cost=%v, want %v %v %v", r.found, r.hasTurn, r.cost, c.found, c.hasTurn, c.cost)
			}
			if !errors.Is(r.err, c.refused) || (c.refused == nil) != (r.err == nil) {
				t.Errorf("got err %v, want %v", r.err, c.refused)
			}
		})
	}
}

// TestScanTranscript checks the bounded scan: the last cost-state record
// wins, a long line before it does not hide it, a quoted marker inside
// another record is not taken for one.
func TestScanTranscript(t *testing.T) {
	long := `{"type":"user","text":"` + strings.Repeat("x", 200<<10) + `"}` + "\n"
	cases := []struct {
		name    string
		doc     string
		hasTurn bool
		cost    float64
	}{
		{"no turn", `{"type":"user"}` + "\n", false, 0},
		{"turn, no cost", `{"type":"assistant"}` + "\n", true, 0},
		{"last cost wins", `{"type":"assistant"}` + "\n" + `{"type":"cost-state","totalCostUSD":1}` + "\n" + long + `{"type":"cost-state","totalCostUSD":2}`, true, 2},
		{"quoted marker", `{"type":"assistant"}` + "\n" + `{"type":"cost-state","totalCostUSD":3}` + "\n" + `{"type":"user","text":"{\"type\":\"cost-state\"}"}` + "\n", true, 3},
		{"marker across buffers", strings.Repeat(" ", 64<<10-5) + `{"type":"assistant"}`, true, 0},
	}
	for _, c := range cases {
		hasTurn, cost := scanTranscript(bytes.NewReader([]byte(c.doc)), int64(len(c.doc)))
		if hasTurn != c.hasTurn || cost != c.cost {
			t.Errorf("%s: got %v %v, want %v %v", c.name, hasTurn, cost, c.hasTurn, c.cost)
		}
	}
}
