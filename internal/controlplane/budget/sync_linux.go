package budget

import (
	"os"
	"syscall"
)

// datasync flushes f's data to the disk (fdatasync, as SQLite itself uses
// on Linux: the file's size and data, not its timestamps).
func datasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
