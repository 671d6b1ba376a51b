package lease

import (
	"context"
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
// is a directory holding one file per generation, g-<generation>. The
// highest generation is the current record. Taking a lease creates the next
// generation's file with link(2), which fails if the file exists, on NFS as
// on local disks: of two replicas racing for the same generation exactly one
// wins. Only the holder rewrites its own generation's file (atomic rename).
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
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lease dir: %w", err)
	}
	return &FileManager{dir: dir, cfg: cfg, now: time.Now}, nil
}

// Duration implements Manager.
func (m *FileManager) Duration() time.Duration { return m.cfg.Duration }

func genName(g int64) string { return fmt.Sprintf("g-%020d", g) }

// current returns the highest-generation record of the lease (Generation 0
// when there is none).
func (m *FileManager) current(name string) (Record, error) {
	entries, err := os.ReadDir(filepath.Join(m.dir, name))
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
		b, err := os.ReadFile(filepath.Join(m.dir, name, genName(g)))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // cleaned up under us
			}
			return Record{}, err
		}
		var r Record
		if err := json.Unmarshal(b, &r); err != nil || r.Generation != g {
			// A torn or foreign file: the generation is taken but unusable;
			// treat it as an expired record of that generation.
			return Record{Generation: g, Holder: "?", ExpiresAt: time.Unix(0, 0)}, nil
		}
		return r, nil
	}
	return Record{}, nil
}

func (m *FileManager) record(gen int64) Record {
	now := m.now()
	return Record{
		Holder: m.cfg.Identity.Holder, Incarnation: m.cfg.Identity.Incarnation, Address: m.cfg.Identity.Address,
		Generation: gen, RenewedAt: now.UTC(), ExpiresAt: now.Add(m.cfg.Duration).UTC(),
	}
}

// writeTemp writes r to a new temp file in the lease dir and returns its path.
func (m *FileManager) writeTemp(name string, r Record) (string, error) {
	b, _ := json.Marshal(r)
	f, err := os.CreateTemp(filepath.Join(m.dir, name), ".tmp-*")
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

// Acquire implements Manager.
func (m *FileManager) Acquire(ctx context.Context, name string) (Record, error) {
	if err := os.MkdirAll(filepath.Join(m.dir, name), 0o700); err != nil {
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	cur, err := m.current(name)
	if err != nil {
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	if cur.HeldBy(m.cfg.Identity) {
		return m.Renew(ctx, name, cur.Generation)
	}
	if !cur.freeFor(m.cfg.Identity, m.now(), m.cfg.Skew) {
		return Record{}, &HeldError{Record: cur}
	}
	next := m.record(cur.Generation + 1)
	tmp, err := m.writeTemp(name, next)
	if err != nil {
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, filepath.Join(m.dir, name, genName(next.Generation))); err != nil {
		if errors.Is(err, fs.ErrExist) {
			won, rerr := m.current(name)
			if rerr != nil {
				return Record{}, fmt.Errorf("acquire lease %s: %w", name, rerr)
			}
			return Record{}, &HeldError{Record: won}
		}
		return Record{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	syncDir(filepath.Join(m.dir, name))
	m.cleanup(name, next.Generation)
	return next, nil
}

// cleanup removes generations older than the previous one.
func (m *FileManager) cleanup(name string, gen int64) {
	entries, _ := os.ReadDir(filepath.Join(m.dir, name))
	for _, e := range entries {
		if g, ok := strings.CutPrefix(e.Name(), "g-"); ok {
			if n, err := strconv.ParseInt(g, 10, 64); err == nil && n < gen-1 {
				os.Remove(filepath.Join(m.dir, name, e.Name()))
			}
		}
	}
}

// Renew implements Manager.
func (m *FileManager) Renew(_ context.Context, name string, gen int64) (Record, error) {
	cur, err := m.current(name)
	if err != nil {
		return Record{}, fmt.Errorf("renew lease %s: %w", name, err)
	}
	if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
		return Record{}, fmt.Errorf("renew lease %s generation %d: %w (current %d held by %s)", name, gen, ErrLost, cur.Generation, cur.Holder)
	}
	next := m.record(gen)
	if err := m.replace(name, next); err != nil {
		return Record{}, fmt.Errorf("renew lease %s: %w", name, err)
	}
	// A taker that judged the lease expired may have linked gen+1 meanwhile.
	if after, err := m.current(name); err == nil && after.Generation != gen {
		return Record{}, fmt.Errorf("renew lease %s generation %d: %w", name, gen, ErrLost)
	}
	return next, nil
}

func (m *FileManager) replace(name string, r Record) error {
	tmp, err := m.writeTemp(name, r)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, name, genName(r.Generation))); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Release implements Manager.
func (m *FileManager) Release(_ context.Context, name string, gen int64) error {
	cur, err := m.current(name)
	if err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	if cur.Generation != gen || !cur.HeldBy(m.cfg.Identity) {
		return nil
	}
	cur.Released = true
	cur.ExpiresAt = m.now().UTC()
	if err := m.replace(name, cur); err != nil {
		return fmt.Errorf("release lease %s: %w", name, err)
	}
	return nil
}

// Get implements Manager.
func (m *FileManager) Get(_ context.Context, name string) (Record, error) {
	r, err := m.current(name)
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
