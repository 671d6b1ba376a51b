package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// RemoveTree removes dir and everything beneath it, as os.RemoveAll does,
// but for trees an agent made, which may be of any depth: os.RemoveAll
// holds a descriptor per directory level, so a tree tens of thousands of
// levels deep exhausts the worker's open-files limit and stays.
//
// RemoveTree holds at most two directory descriptors at any time: dir's,
// and that of one of its direct subdirectories. It empties dir level by
// level: files and symbolic links are unlinked (unlinkat, never followed),
// empty directories removed, and the subdirectories of a subdirectory are
// moved up into dir (renameat2 RENAME_NOREPLACE, under a name of its own)
// to be emptied in a later pass, which flattens any depth. Nothing is
// opened through a symbolic link (O_NOFOLLOW): a link the agent left
// inside, or put in place of a directory meanwhile, is removed, its
// target left alone. dir itself a symbolic link is removed, not followed.
//
// The tree's processes should be gone (a tree that keeps growing is
// removed all the same unless it outgrows the removal). A missing dir is
// no error. An entry that cannot be removed (a mount point, an immutable
// file) ends the removal with an error after the pass that met it.
func RemoveTree(dir string) error {
	if dir == "" {
		return errors.New("remove tree: no directory")
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP):
		// A file, or a symbolic link (removed, not followed).
		if err := unix.Unlink(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "unlink", Path: dir, Err: err}
		}
		return nil
	case err != nil:
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	top := os.NewFile(uintptr(fd), dir)
	err = emptyTop(top)
	top.Close()
	if err != nil {
		return err
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

// removeBatch is how many names are read from a directory at a time.
const removeBatch = 1024

// emptyTop removes everything in the directory top, pass after pass, until
// a pass finds it empty or meets an entry it cannot remove.
func emptyTop(top *os.File) error {
	tfd := int(top.Fd())
	var moved uint64 // names given to moved-up directories: .rm-<n>
	for {
		if _, err := top.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("remove %s: %w", top.Name(), err)
		}
		seen := 0
		var errs []error
		for {
			names, err := top.Readdirnames(removeBatch)
			for _, name := range names {
				seen++
				if err := removeEntry(top, tfd, name, &moved); err != nil {
					errs = append(errs, err)
				}
			}
			if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
				break
			}
			if err != nil {
				return fmt.Errorf("remove %s: %w", top.Name(), err)
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		if seen == 0 {
			return nil
		}
	}
}

// removeEntry removes top's entry name: a file or link at once; a
// directory once empty, after moving its own subdirectories up into top.
func removeEntry(top *os.File, tfd int, name string, moved *uint64) error {
	for attempt := 0; ; attempt++ {
		err := unix.Unlinkat(tfd, name, 0)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
			return pathErr("unlink", top, name, err)
		}
		// A directory (Linux says EISDIR; POSIX allows EPERM).
		err = unix.Unlinkat(tfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return pathErr("rmdir", top, name, err)
		}
		fd, err := unix.Openat(tfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if (errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOENT)) && attempt < 3 {
				continue // replaced meanwhile (by a link or file): once more
			}
			return pathErr("open", top, name, err)
		}
		sub := os.NewFile(uintptr(fd), top.Name()+"/"+name)
		err = flattenInto(sub, tfd, top.Name(), moved)
		sub.Close()
		if err != nil {
			return err
		}
		err = unix.Unlinkat(tfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if (!errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST)) || attempt >= 3 {
			return pathErr("rmdir", top, name, err)
		}
		// Something appeared meanwhile: once more.
	}
}

// flattenInto empties sub, a direct subdirectory of top (descriptor tfd,
// path topName): it unlinks sub's files and links and moves its
// subdirectories up into top, to be removed by a later pass there.
func flattenInto(sub *os.File, tfd int, topName string, moved *uint64) error {
	sfd := int(sub.Fd())
	var errs []error
	for {
		names, err := sub.Readdirnames(removeBatch)
		for _, name := range names {
			err := unix.Unlinkat(sfd, name, 0)
			if err == nil || errors.Is(err, unix.ENOENT) {
				continue
			}
			if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
				errs = append(errs, &os.PathError{Op: "unlink", Path: sub.Name() + "/" + name, Err: err})
				continue
			}
			if err := unix.Unlinkat(sfd, name, unix.AT_REMOVEDIR); err == nil || errors.Is(err, unix.ENOENT) {
				continue
			}
			if err := moveUp(sfd, name, tfd, moved); err != nil {
				errs = append(errs, &os.PathError{Op: "move up into " + topName, Path: sub.Name() + "/" + name, Err: err})
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", sub.Name(), err))
			break
		}
	}
	return errors.Join(errs...)
}

// moveUp renames sfd's entry name into tfd under a new name, replacing
// nothing.
func moveUp(sfd int, name string, tfd int, moved *uint64) error {
	for {
		*moved++
		to := ".rm-" + strconv.FormatUint(*moved, 10)
		err := unix.Renameat2(sfd, name, tfd, to, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			continue // a name of the tree's own: the next one
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			// No RENAME_NOREPLACE on this filesystem: look first (the
			// tree's processes are gone, nothing races us).
			var st unix.Stat_t
			if unix.Fstatat(tfd, to, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				continue
			}
			err = unix.Renameat(sfd, name, tfd, to)
		}
		return err
	}
}

func pathErr(op string, dir *os.File, name string, err error) error {
	return &os.PathError{Op: op, Path: dir.Name() + "/" + name, Err: err}
}
