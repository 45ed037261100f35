//go:build !linux

package filestore

import "os"

// syncFile is fdatasync, replaced by tests to inject errors.
var syncFile = fdatasync

// fdatasync flushes f; without fdatasync, with a full fsync.
func fdatasync(f *os.File) error { return f.Sync() }
