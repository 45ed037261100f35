package filestore

import "errors"

// Errors specific to filestore. Corrupt bytes are reported with
// [ferry.ErrCorrupt], closed stores and queues with [ferry.ErrClosed].
var (
	// ErrLocked is returned by [Open] when another Store, in this process
	// or another one, holds the directory.
	ErrLocked = errors.New("directory locked by another store")
	// ErrFailed is returned by every write to a queue (and every commit to
	// the cursor store) after a write or fsync error. Linux may drop dirty
	// pages that failed to reach the disk and report a later fsync as a
	// success, so a failed queue never retries: it fails every later write
	// until the store is closed and opened again, which recovers the files
	// from what is on disk.
	ErrFailed = errors.New("failed after an I/O error")
	// ErrReadOnly is returned by every write (a queue's Write, a commit,
	// saving a topic) of a store opened with [OpenReadOnly].
	ErrReadOnly = errors.New("store opened read-only")
)
