//go:build linux

package filestore

import (
	"errors"
	"os"
	"syscall"
)

// mmapSupported says whether the active segment may be memory-mapped:
// on 64-bit Linux, where a mapping per queue costs address space only.
const mmapSupported = ^uint(0)>>63 == 1

// mmapFile maps the first n bytes of f, shared and writable. The file may
// be shorter: only its first size bytes may be touched.
func mmapFile(f *os.File, n int) ([]byte, error) {
	b, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: f.Name(), Err: err}
	}
	return b, nil
}

// munmapFile removes a mapping made by mmapFile.
func munmapFile(f *os.File, b []byte) error {
	if err := syscall.Munmap(b); err != nil {
		return &os.PathError{Op: "munmap", Path: f.Name(), Err: err}
	}
	return nil
}

// fallocateFile is fallocate, replaced by tests to inject errors.
var fallocateFile = fallocate

// fallocate reserves the disk blocks of bytes [off, off+n) of f, growing
// the file, so that writing them through a mapping cannot run out of
// space.
func fallocate(f *os.File, off, n int64) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, off, n)
		if err != syscall.EINTR {
			if err != nil {
				return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}

// noReserve reports whether err says the file system cannot reserve
// space, so the queue writes with pwrite instead.
func noReserve(err error) bool {
	return errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EINVAL)
}
