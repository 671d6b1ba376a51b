// Package atomicfile replaces files so that readers, and the machine after a
// crash, see the old content or the new, never a mix: WriteFile writes a
// temp file in the same directory, syncs it, renames it over the target and
// syncs the directory; SyncDir makes a directory's entries (a rename, a
// create, a remove) durable.
//
// The worker's stores (SessionStore, outbox, report cursors) and the
// launcher's state use it. It does not lock: two writers of one path leave
// one of the two contents.
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteFile replaces path with data: write to a temp file in the same
// directory, fsync, close, rename over path, fsync the directory. Readers see
// the old or the new content, never a mix, also after a crash.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir fsyncs directory dir, making its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
