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

// fsys is the file system under a store: its root, and every call the
// store makes that creates, changes, syncs or deletes a file (on the write,
// roll, seal, retention, recovery, metadata and cursor paths). Each call
// first asks fault, when set, whether to fail: tests set it (an unexported
// option) to inject an I/O error at any one of them, and check that the
// store reports it and that Open accepts what it leaves.
type fsys struct {
	root  *os.Root
	fault func(op, name string) error
}

// The operations fault is asked about.
const (
	opCreate    = "create"
	opOpen      = "open"
	opWrite     = "write"
	opFallocate = "fallocate"
	opSync      = "fdatasync"
	opTruncate  = "truncate"
	opRename    = "rename"
	opRemove    = "remove"
	opMkdir     = "mkdir"
	opSyncDir   = "syncdir"
	opMmap      = "mmap"
	opMunmap    = "munmap"
)

func (x *fsys) check(op, name string) error {
	if x.fault == nil {
		return nil
	}
	if err := x.fault(op, name); err != nil {
		return &os.PathError{Op: op, Path: name, Err: err}
	}
	return nil
}

// openFile opens name of the root; a create (os.O_CREATE) is opCreate.
func (x *fsys) openFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	op := opOpen
	if flag&os.O_CREATE != 0 {
		op = opCreate
	}
	if err := x.check(op, name); err != nil {
		return nil, err
	}
	return x.root.OpenFile(name, flag, perm)
}

func (x *fsys) remove(name string) error {
	if err := x.check(opRemove, name); err != nil {
		return err
	}
	return x.root.Remove(name)
}

func (x *fsys) rename(from, to string) error {
	if err := x.check(opRename, to); err != nil {
		return err
	}
	return x.root.Rename(from, to)
}

// sync fdatasyncs f.
func (x *fsys) sync(f *os.File) error {
	if err := x.check(opSync, f.Name()); err != nil {
		return err
	}
	return syncFile(f)
}

func (x *fsys) truncate(f *os.File, n int64) error {
	if err := x.check(opTruncate, f.Name()); err != nil {
		return err
	}
	return f.Truncate(n)
}

func (x *fsys) writeAt(f *os.File, b []byte, at int64) error {
	if err := x.check(opWrite, f.Name()); err != nil {
		return err
	}
	_, err := f.WriteAt(b, at)
	return err
}

func (x *fsys) fallocate(f *os.File, off, n int64) error {
	if err := x.check(opFallocate, f.Name()); err != nil {
		return err
	}
	return fallocateFile(f, off, n)
}

func (x *fsys) mmap(f *os.File, n int) ([]byte, error) {
	if err := x.check(opMmap, f.Name()); err != nil {
		return nil, err
	}
	return mmapFile(f, n)
}

// munmap removes a mapping. It is asked about, but always done: a mapping
// left behind would outlive the file.
func (x *fsys) munmap(f *os.File, b []byte) error {
	err := x.check(opMunmap, f.Name())
	return errors.Join(err, munmapFile(f, b))
}

// mkdirSync creates directory name (0700) if it is missing and syncs its
// parent.
func (x *fsys) mkdirSync(name string) error {
	if err := x.check(opMkdir, name); err != nil {
		return err
	}
	err := x.root.Mkdir(name, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return x.syncDir(path.Dir(name))
}

// syncDir fsyncs directory name of root, making the creates, renames and
// deletes in it durable.
func (x *fsys) syncDir(name string) error {
	if err := x.check(opSyncDir, name); err != nil {
		return err
	}
	d, err := x.root.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// writeFileRename replaces name with data atomically: a temporary file,
// fsync (when durable), rename, fsync of the directory. A failure leaves
// the old file in place, or the new one, and at most a temporary file,
// which Open removes.
func (x *fsys) writeFileRename(name string, data []byte, durable bool) error {
	tmp := name + ".tmp"
	f, err := x.openFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = x.writeAt(f, data, 0)
	if err == nil && durable {
		err = x.sync(f)
	}
	if err = errors.Join(err, f.Close()); err != nil {
		_ = x.root.Remove(tmp)
		return err
	}
	if err := x.rename(tmp, name); err != nil {
		return err
	}
	return x.syncDir(path.Dir(name))
}

func syncPath(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
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
