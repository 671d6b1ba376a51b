package lease

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// FileManager keeps leases on a shared file system, NFS included. A lease
// is a directory holding one file per generation, g-<generation>; the
// highest generation is the current record. Taking a lease creates the next
// generation's file with link(2), which fails if the file exists, on NFS as
// on local disks: of two processes racing for the same generation exactly
// one wins. Only the holder rewrites its own generation's file (atomic
// rename). Conversation leases live in <dir>/<name>/, replica leases in
// <dir>/.replicas/<holder>/ (a conversation id has no dot, so the two never
// meet).
type FileManager struct {
	dir string
	cfg Config
	now func() time.Time
}

var _ Manager = (*FileManager)(nil)

// NewFileManager keeps leases under dir.
func NewFileManager(dir string, cfg Config) (*FileManager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, ".replicas"), 0o700); err != nil {
		return nil, fmt.Errorf("lease dir: %w", err)
	}
	return &FileManager{dir: dir, cfg: cfg, now: time.Now}, nil
}

// Duration implements Manager.
func (m *FileManager) Duration() time.Duration { return m.cfg.Duration }

func genName(g int64) string { return fmt.Sprintf("g-%020d", g) }

func (m *FileManager) convDir(name string) string { return filepath.Join(m.dir, name) }

// replicaDir is the replica lease's directory. A holder name that is not a
// plain file name (a host name always is) is hex-encoded.
func (m *FileManager) replicaDir(holder string) string {
	safe := holder != "" && holder != "." && holder != ".." && !strings.ContainsAny(holder, "/\\\x00") && len(holder) <= 200
	if !safe {
		holder = "x-" + hex.EncodeToString([]byte(holder))
	}
	return filepath.Join(m.dir, ".replicas", holder)
}

// current returns the highest-generation record in dir (Generation 0 when
// there is none).
func current(dir string) (Record, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, nil
	}
	if err != nil {
		return Record{}, err
	}
	var gens []int64
	for _, e := range entries {
		if g, ok := strings.CutPrefix(e.Name(), "g-"); ok {
			if n, err := strconv.ParseInt(g, 10, 64); err == nil {
				gens = append(gens, n)
			}
		}
	}
	sort.Slice(gens, func(i, j int) bool { return gens[i] > gens[j] })
	for _, g := range gens {
		b, err := os.ReadFile(filepath.Join(dir, genName(g)))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // cleaned up under us
			}
			return Record{}, err
		}
		var r Record
		if err := json.Unmarshal(b, &r); err != nil || r.Generation != g {
			// A torn or foreign file: the generation is taken but unusable;
			// treat it as a released record of that generation.
			return Record{Generation: g, Holder: "?", Released: true}, nil
		}
		return r, nil
	}
	return Record{}, nil
}

// record is this identity's record of generation gen, written now; expires
// is set for replica leases only.
func (m *FileManager) record(gen int64, expires bool) Record {
	now := m.now()
	r := Record{
		Holder: m.cfg.Identity.Holder, Incarnation: m.cfg.Identity.Incarnation, Address: m.cfg.Identity.Address,
		Generation: gen, RenewedAt: now.UTC(),
	}
	if expires {
		r.ExpiresAt = now.Add(m.cfg.Duration).UTC()
	}
	return r
}

// writeTemp writes r to a new temp file in dir and returns its path.
func writeTemp(dir string, r Record) (string, error) {
	b, _ := json.Marshal(r)
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", err
	}
	_, werr := f.Write(b)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// take creates generation next.Generation in dir; false when another
// process created it first.
func take(dir string, next Record) (bool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	tmp, err := writeTemp(dir, next)
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, filepath.Join(dir, genName(next.Generation))); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	syncDir(dir)
	cleanup(dir, next.Generation)
	return true, nil
}

// cleanup removes generations older than the previous one.
func cleanup(dir string, gen int64) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if g, ok := strings.CutPrefix(e.Name(), "g-"); ok {
			if n, err := strconv.ParseInt(g, 10, 64); err == nil && n < gen-1 {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
}

// replace rewrites r's own generation file in dir.
func replace(dir string, r Record) error {
	tmp, err := writeTemp(dir, r)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, genName(r.Generation))); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Heartbeat implements Manager.
func (m *FileManager) Heartbeat(_ context.Context, gen int64) (Record, error) {
	dir := m.replicaDir(m.cfg.Identity.Holder)
	cur, err := current(dir)
	if err != nil {
		return Record{}, fmt.Errorf("replica lease: %w", err)
	}
	if gen != 0 {
		if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
			return Record{}, fmt.Errorf("renew replica lease generation %d: %w (current %d held by %s/%s)", gen, ErrLost, cur.Generation, cur.Holder, cur.Incarnation)
		}
		next := m.record(gen, true)
		if err := replace(dir, next); err != nil {
			return Record{}, fmt.Errorf("renew replica lease: %w", err)
		}
		// A taker that judged the lease expired may have linked gen+1.
		if after, err := current(dir); err == nil && after.Generation != gen {
			return Record{}, fmt.Errorf("renew replica lease generation %d: %w", gen, ErrLost)
		}
		return next, nil
	}
	if !cur.replicaFreeFor(m.cfg.Identity, m.now(), m.cfg.Skew) {
		return Record{}, &HeldError{Record: cur}
	}
	next := m.record(cur.Generation+1, true)
	won, err := take(dir, next)
	if err != nil {
		return Record{}, fmt.Errorf("take replica lease: %w", err)
	}
	if !won {
		cur, _ := current(dir)
		return Record{}, &HeldError{Record: cur}
	}
	return next, nil
}

// ReleaseReplica implements Manager.
func (m *FileManager) ReleaseReplica(_ context.Context, gen int64) error {
	return m.release(m.replicaDir(m.cfg.Identity.Holder), gen)
}

func (m *FileManager) release(dir string, gen int64) error {
	cur, err := current(dir)
	if err != nil {
		return fmt.Errorf("release lease: %w", err)
	}
	if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
		return nil
	}
	cur.Released = true
	cur.ExpiresAt = m.now().UTC()
	if err := replace(dir, cur); err != nil {
		return fmt.Errorf("release lease: %w", err)
	}
	return nil
}

// live fills cur.ExpiresAt from its holder's replica lease and reports
// whether the holding is alive.
func (m *FileManager) live(cur Record) (Record, bool, error) {
	if cur.Generation == 0 || cur.Released {
		cur.ExpiresAt = time.Time{}
		return cur, false, nil
	}
	rep, err := current(m.replicaDir(cur.Holder))
	if err != nil {
		return cur, false, err
	}
	alive, exp := convLive(cur, rep, m.now(), m.cfg.Skew)
	cur.ExpiresAt = exp
	return cur, alive, nil
}

// Acquire implements Manager.
func (m *FileManager) Acquire(_ context.Context, name string) (Record, error) {
	dir := m.convDir(name)
	cur, err := current(dir)
	if err != nil {
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	if cur.Holder != m.cfg.Identity.Holder {
		cur, alive, err := m.live(cur)
		if err != nil {
			return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
		}
		if alive {
			return Record{}, &HeldError{Record: cur}
		}
	}
	next := m.record(cur.Generation+1, false)
	won, err := take(dir, next)
	if err != nil {
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	if !won {
		cur, _ := current(dir)
		cur, _, _ = m.live(cur)
		return Record{}, &HeldError{Record: cur}
	}
	return next, nil
}

// Release implements Manager.
func (m *FileManager) Release(_ context.Context, name string, gen int64) error {
	if err := m.release(m.convDir(name), gen); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// Get implements Manager.
func (m *FileManager) Get(_ context.Context, name string) (Record, error) {
	r, err := current(m.convDir(name))
	if err == nil {
		r, _, err = m.live(r)
	}
	if err != nil {
		return Record{}, fmt.Errorf("read lease %s: %w", name, err)
	}
	return r, nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// Replica implements Manager.
func (m *FileManager) Replica(_ context.Context, holder string) (Record, error) {
	r, err := current(m.replicaDir(holder))
	if err != nil {
		return Record{}, fmt.Errorf("read replica lease %s: %w", holder, err)
	}
	return r, nil
}

// Forget implements Manager.
func (m *FileManager) Forget(_ context.Context, name string) error {
	if err := os.RemoveAll(m.convDir(name)); err != nil {
		return fmt.Errorf("forget lease %s: %w", name, err)
	}
	return nil
}
