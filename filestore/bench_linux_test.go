package filestore_test

import (
	"os"
	"syscall"
)

// fadviseDontNeed is posix_fadvise(POSIX_FADV_DONTNEED) over the whole
// file: its clean pages leave the page cache.
func fadviseDontNeed(f *os.File) {
	const dontNeed = 4
	_, _, _ = syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, dontNeed, 0, 0)
}
