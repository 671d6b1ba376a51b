// Package samples holds the sample projects a new conversation can start
// from (a conversation created with "sample": "<name>"), embedded in the
// binary: Names lists them, FS gives one's files, and Copy makes a fresh
// working tree of one, owned by the conversation's agent.
//
//   - java-calculator: com.acme.Calculator with two JUnit 4 tests, one of
//     which fails on a real bug (Calculator.power is off by one:
//     "expected:<8> but was:<4>"). It builds offline with Debian's Gradle
//     4.4.1 and Debian's JUnit 4 jars (/usr/share/java/junit4.jar and
//     hamcrest-core.jar, packages gradle and junit4, which `make tools`
//     installs); docs/builds.md.
//
// It is not a template engine: files are copied as they are.
package samples

import (
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

//go:embed all:java-calculator
var files embed.FS

// ErrUnknown is returned (wrapped) for a name that is not a sample.
var ErrUnknown = errors.New("no such sample project")

// Modes of a copied sample's entries.
const (
	fileMode = 0o644 // files (embedded files carry no mode; none is executable)
	dirMode  = 0o755 // directories below the top
	topMode  = 0o700 // the working tree itself, as the harness makes it
)

// Names returns the samples' names, sorted.
func Names() []string {
	entries, _ := files.ReadDir(".")
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names
}

// FS returns the files of the sample name, rooted at its top directory.
// Errors: ErrUnknown.
func FS(name string) (fs.FS, error) {
	if !slices.Contains(Names(), name) {
		return nil, fmt.Errorf("sample %q: %w (have %s)", name, ErrUnknown, strings.Join(Names(), ", "))
	}
	return fs.Sub(files, name)
}

// Copy creates dst, a directory that must not exist yet (its parent must:
// the workspace root, which the worker owns), holding the files of the
// sample name, and gives the whole tree to uid:gid (-1 keeps the caller's
// id, as os.Chown does): dst 0700, directories 0755, files 0644.
//
// It is safe for a worker running as root beside agents: dst is created
// with mkdirat (an existing file, directory or symbolic link there is an
// error, fs.ErrExist inside), everything is created beneath dst's own
// descriptor with O_EXCL and O_NOFOLLOW, and the owner is changed only
// once the tree is complete, so while root writes it no agent can place a
// link in it. On error the partial tree is removed (it is still the
// caller's) and nothing is left at dst. Errors: ErrUnknown, the file
// system's.
func Copy(name, dst string, uid, gid int) error {
	src, err := FS(name)
	if err != nil {
		return err
	}
	parent, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return fmt.Errorf("copy sample %s: %w", name, err)
	}
	defer parent.Close()
	base := filepath.Base(dst)
	if err := unix.Mkdirat(int(parent.Fd()), base, topMode); err != nil {
		return fmt.Errorf("copy sample %s: create %s: %w", name, dst, pathErr("mkdir", dst, err))
	}
	top, err := openDirAt(int(parent.Fd()), base)
	if err == nil {
		err = fill(top, src, uid, gid)
		if err == nil {
			// Last: from here on the tree is the agent's.
			err = unix.Fchown(top, uid, gid)
		}
		unix.Close(top)
	}
	if err != nil {
		_ = os.RemoveAll(dst)
		return fmt.Errorf("copy sample %s to %s: %w", name, dst, err)
	}
	return nil
}

// fill writes src's files beneath the directory top, then gives each
// entry (not top) to uid:gid.
func fill(top int, src fs.FS, uid, gid int) error {
	var created []string // in creation order: a directory before its entries
	err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		dir, err := openDirAt(top, path.Dir(p))
		if err != nil {
			return err
		}
		defer unix.Close(dir)
		name := path.Base(p)
		switch {
		case d.IsDir():
			if err := unix.Mkdirat(dir, name, dirMode); err != nil {
				return pathErr("mkdir", p, err)
			}
		case d.Type().IsRegular():
			if err := writeAt(dir, name, src, p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
		created = append(created, p)
		return nil
	})
	if err != nil {
		return err
	}
	if uid == -1 && gid == -1 {
		return nil
	}
	for _, p := range created {
		if err := unix.Fchownat(top, p, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathErr("chown", p, err)
		}
	}
	return nil
}

// writeAt creates name beneath dir (which must not hold it) with src's p.
func writeAt(dir int, name string, src fs.FS, p string) error {
	fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, fileMode)
	if err != nil {
		return pathErr("create", p, err)
	}
	out := os.NewFile(uintptr(fd), p)
	in, err := src.Open(p)
	if err != nil {
		out.Close()
		return err
	}
	defer in.Close()
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// openDirAt opens the directory name beneath dirfd (a path of plain names
// from the embedded tree, "." for dirfd itself), following no link.
func openDirAt(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, pathErr("open", name, err)
	}
	return fd, nil
}

func pathErr(op, name string, err error) error {
	return &fs.PathError{Op: op, Path: name, Err: err}
}
