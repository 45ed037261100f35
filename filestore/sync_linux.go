package filestore

import (
	"os"
	"syscall"
)

// syncFile is fdatasync, replaced by tests to inject errors.
var syncFile = fdatasync

// fdatasync flushes f's data (and the metadata needed to read it back).
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}
