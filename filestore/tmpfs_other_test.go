//go:build !linux

package filestore

import (
	"errors"
	"testing"
)

func mountTmpfs(t *testing.T, size int64) (string, error) {
	return "", errors.New("tmpfs is mounted on Linux only")
}
