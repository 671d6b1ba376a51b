//go:build !linux

package budget

import "os"

// datasync flushes f to the disk.
func datasync(f *os.File) error { return f.Sync() }
