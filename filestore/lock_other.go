//go:build !unix

package filestore

import (
	"errors"
	"os"
)

func lockFile(f *os.File) error {
	return errors.New("directory locking is not supported on this platform")
}
