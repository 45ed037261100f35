//go:build !linux

package filestore

import (
	"errors"
	"os"
)

// mmapSupported says whether the active segment may be memory-mapped: not
// on this platform, where every write is a pwrite.
const mmapSupported = false

var errNoMmap = errors.New("memory mapping not used on this platform")

func mmapFile(*os.File, int) ([]byte, error) { return nil, errNoMmap }

func munmapFile(*os.File, []byte) error { return nil }

var fallocateFile = func(*os.File, int64, int64) error { return errNoMmap }

func noReserve(error) bool { return true }
