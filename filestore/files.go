package filestore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"

	"github.com/ferrymq/ferry"
)

// mkdirSync creates directory name (0700) if it is missing and syncs its
// parent.
func mkdirSync(root *os.Root, name string) error {
	err := root.Mkdir(name, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return syncDir(root, path.Dir(name))
}

// syncDir fsyncs directory name of root, making the creates, renames and
// deletes in it durable.
func syncDir(root *os.Root, name string) error {
	d, err := root.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

func syncPath(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// writeFileRename replaces name with data atomically: a temporary file,
// fsync (when durable), rename, fsync of the directory.
func writeFileRename(root *os.Root, name string, data []byte, durable bool) error {
	tmp := name + ".tmp"
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && durable {
		err = syncFile(f)
	}
	if err = errors.Join(err, f.Close()); err != nil {
		_ = root.Remove(tmp)
		return err
	}
	if err := root.Rename(tmp, name); err != nil {
		return err
	}
	return syncDir(root, path.Dir(name))
}

// readBounded reads file name of root, refusing one larger than limit
// before allocating.
func readBounded(root *os.Root, name string, limit int64) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes, at most %d expected", ferry.ErrCorrupt, name, fi.Size(), limit)
	}
	b := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, err
	}
	return b, nil
}
