package imagebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// gzipLevel is the compression of every layer, with klauspost/compress's
// gzip (already a dependency of go-containerregistry; about twice as fast as
// compress/gzip at the same ratio, which matters for a 400 MB CLI). Its
// output is deterministic for a given version: the level and the version
// pinned in go.mod are part of what makes a digest.
const gzipLevel = gzip.DefaultCompression

// entry is one member of a layer: its header and its content, held in Data
// or read from the file at Path when the layer is written.
type entry struct {
	hdr  tar.Header
	data []byte
	path string
}

// layerBuilder collects a layer's entries in any order; write sorts them.
type layerBuilder struct {
	entries []entry
	names   map[string]bool
}

func cleanName(name string) (string, error) {
	n := strings.TrimPrefix(path.Clean("/"+name), "/")
	if n == "" || n == "." {
		return "", fmt.Errorf("layer entry %q: not a path below the root", name)
	}
	return n, nil
}

func (b *layerBuilder) add(e entry) error {
	n, err := cleanName(e.hdr.Name)
	if err != nil {
		return err
	}
	if b.names == nil {
		b.names = map[string]bool{}
	}
	if b.names[n] {
		return fmt.Errorf("layer entry %q: twice", n)
	}
	b.names[n] = true
	e.hdr.Name = n
	b.entries = append(b.entries, e)
	return nil
}

// dir adds a directory.
func (b *layerBuilder) dir(name string, mode int64, uid, gid int) error {
	return b.add(entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: gid}})
}

// file adds a regular file owned by root with the given content.
func (b *layerBuilder) file(name string, mode int64, data []byte) error {
	return b.add(entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, data: data})
}

// fileFrom adds the file at src (read when the layer is written), owned by
// root, with mode 0755 if src has any execute bit, else 0644: the mode on
// disk depends on the umask of whoever made it, the image's must not.
func (b *layerBuilder) fileFrom(name, src string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", src)
	}
	mode := int64(0o644)
	if fi.Mode().Perm()&0o111 != 0 {
		mode = 0o755
	}
	return b.add(entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: fi.Size()}, path: src})
}

// addTar adds every member of the tar stream r (a base root filesystem),
// keeping its type, mode and numeric owner and dropping everything else
// (owner names, extended attributes, access and change times). Contents are
// held in memory: a base is a few hundred megabytes on a machine with far
// more. Device nodes are refused: a layer has none, the runtime makes /dev.
func (b *layerBuilder) addTar(r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read base tarball: %w", err)
		}
		e := entry{hdr: tar.Header{Typeflag: h.Typeflag, Name: h.Name, Linkname: h.Linkname,
			Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, ModTime: h.ModTime}}
		switch h.Typeflag {
		case tar.TypeReg:
			if e.data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("read base tarball: %s: %w", h.Name, err)
			}
			e.hdr.Size = int64(len(e.data))
		case tar.TypeDir, tar.TypeSymlink, tar.TypeFifo:
		case tar.TypeLink:
			if e.hdr.Linkname, err = cleanName(h.Linkname); err != nil {
				return err
			}
		default:
			return fmt.Errorf("base tarball: %s: type %q is not allowed in a layer", h.Name, h.Typeflag)
		}
		if err := b.add(e); err != nil {
			return err
		}
	}
}

// header returns the header of the member name, of any type, or false.
func (b *layerBuilder) header(name string) (tar.Header, bool) {
	for _, e := range b.entries {
		if e.hdr.Name == name {
			return e.hdr, true
		}
	}
	return tar.Header{}, false
}

// lookup returns the content of the regular file name, or false.
func (b *layerBuilder) lookup(name string) ([]byte, bool) {
	for _, e := range b.entries {
		if e.hdr.Name == name && e.hdr.Typeflag == tar.TypeReg {
			if e.path != "" {
				data, err := os.ReadFile(e.path)
				return data, err == nil
			}
			return e.data, true
		}
	}
	return nil, false
}

// privilegeBits are the setuid and setgid bits, which writeTo clears on
// every member but a directory (where setgid only makes new files inherit
// the group). A Debian base has a dozen such programs (su, mount, passwd,
// chage, ssh-agent, …); nothing in the images needs one, and clearing them
// when each layer is written cleans a base cached before this too.
const privilegeBits = 0o6000

// writeOptions say how a layer is written.
type writeOptions struct {
	// Clamp, when not zero, is the latest modification time a member may
	// have (SOURCE_DATE_EPOCH); entries with no time get it too.
	Clamp time.Time
	// Gzip compresses the stream (at gzipLevel).
	Gzip bool
}

// writeTo writes the layer to w: members sorted by name (so parents come
// before their children), numeric owners only, times in whole seconds, and
// no setuid or setgid file (privilegeBits). A hard link must sort after its
// target.
func (b *layerBuilder) writeTo(w io.Writer, o writeOptions) error {
	sorted := append([]entry(nil), b.entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].hdr.Name < sorted[j].hdr.Name })
	var zw *gzip.Writer
	if o.Gzip {
		var err error
		if zw, err = gzip.NewWriterLevel(w, gzipLevel); err != nil {
			return err
		}
		w = zw
	}
	tw := tar.NewWriter(w)
	written := make(map[string]bool, len(sorted))
	for _, e := range sorted {
		h := e.hdr
		h.Uname, h.Gname = "", ""
		h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
		h.PAXRecords, h.Xattrs = nil, nil //nolint:staticcheck // Xattrs cleared on purpose
		h.Format = tar.FormatUnknown
		if h.Typeflag != tar.TypeDir {
			h.Mode &^= privilegeBits
		}
		if !o.Clamp.IsZero() && (h.ModTime.IsZero() || h.ModTime.After(o.Clamp)) {
			h.ModTime = o.Clamp
		}
		h.ModTime = h.ModTime.Truncate(time.Second)
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(0, 0)
		}
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if h.Typeflag == tar.TypeLink && !written[h.Linkname] {
			return fmt.Errorf("layer entry %q: hard link to %q, which is not before it", h.Name, h.Linkname)
		}
		if err := tw.WriteHeader(&h); err != nil {
			return fmt.Errorf("write layer entry %q: %w", h.Name, err)
		}
		written[e.hdr.Name] = true
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if err := copyContent(tw, e); err != nil {
			return fmt.Errorf("write layer entry %q: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if zw != nil {
		return zw.Close()
	}
	return nil
}

func copyContent(w io.Writer, e entry) error {
	if e.path == "" {
		_, err := io.Copy(w, bytes.NewReader(e.data))
		return err
	}
	f, err := os.Open(e.path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, f)
	if err == nil && n != e.hdr.Size {
		err = fmt.Errorf("%s changed size while being written (%d, want %d bytes)", e.path, n, e.hdr.Size)
	}
	return err
}

// writeFile writes the layer to the file at p (atomically).
func (b *layerBuilder) writeFile(p string, o writeOptions) error {
	return writeAtomic(p, func(w io.Writer) error { return b.writeTo(w, o) })
}

// layer writes the builder's entries gzipped to the file p and returns it as
// an OCI layer backed by that file, which must stay until the image is
// written. Compressing here, once, means go-containerregistry never
// compresses it again (it would, for the digest and each write, otherwise).
func (b *layerBuilder) layer(p string, clamp time.Time) (v1.Layer, error) {
	if err := b.writeFile(p, writeOptions{Clamp: clamp, Gzip: true}); err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(p) },
		tarball.WithMediaType(types.OCILayer))
}

// writeAtomic writes a file through a temporary file in the same directory
// and renames it into place, so a reader never sees half a file.
func writeAtomic(p string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+filepath.Base(p)+"-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := write(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
