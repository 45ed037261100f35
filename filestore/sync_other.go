//go:build !linux

package filestore

import "os"

// fdatasync flushes f; without fdatasync, with a full fsync.
func fdatasync(f *os.File) error { return f.Sync() }
