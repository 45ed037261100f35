package filestore

import (
	"fmt"
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory and
// returns it, unmounted when the test ends; it returns "" where the
// environment does not allow it (not root, no tmpfs, a sandbox), with the
// reason.
func mountTmpfs(t *testing.T, size int64) (string, error) {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		return "", fmt.Errorf("mount -t tmpfs -o size=%d tmpfs %s: %w", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir, nil
}
