package filestore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/ferrymq/ferry"
)

// recoverQueue opens the segments of a queue's folder, creating the folder
// and a first segment when missing, and starts the queue.
func (st *Store) recoverQueue(id ferry.QueueID, ret ferry.Retention) (*queue, error) {
	qdir := path.Join("topics", id.Topic, strconv.Itoa(id.Queue))
	if err := st.files.mkdirSync(qdir); err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(st.root.FS(), qdir)
	if err != nil {
		return nil, err
	}
	removed := false
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".tmp") {
			_ = st.files.remove(path.Join(qdir, n))
			removed = true
		}
	}
	bases, indexes := listSegments(entries)
	key := st.key(id)
	var segs []*segment
	closeAll := func() {
		for _, s := range segs {
			_ = s.f.Close()
		}
	}
	if len(bases) == 0 {
		name := segmentName(qdir, 0)
		f, err := st.files.openFile(name, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := st.files.syncDir(qdir); err != nil {
			_ = f.Close()
			return nil, err
		}
		segs = append(segs, &segment{name: name, f: f})
	}
	for i, base := range bases {
		name := segmentName(qdir, base)
		f, err := st.files.openFile(name, os.O_RDWR, 0)
		if err != nil {
			closeAll()
			return nil, err
		}
		s := &segment{name: name, f: f, base: base, next: base}
		segs = append(segs, s)
		if i > 0 && segs[i-1].next != base {
			closeAll()
			return nil, fmt.Errorf("%w: %s starts at offset %d, the segment before it ends at %d", ferry.ErrCorrupt, name, base, segs[i-1].next)
		}
		fi, err := f.Stat()
		if err != nil {
			closeAll()
			return nil, err
		}
		if i < len(bases)-1 {
			err = st.recoverSealed(s, fi.Size(), indexes[base], qdir, key)
		} else {
			err = st.recoverNewest(id, s, fi.Size(), indexes[base], qdir, key)
		}
		if err != nil {
			closeAll()
			return nil, err
		}
	}
	for b := range indexes { // orphans of deleted segments
		if !slices.Contains(bases, b) {
			_ = st.files.remove(indexName(qdir, b))
			removed = true
		}
	}
	if removed {
		if err := st.files.syncDir(qdir); err != nil {
			closeAll()
			return nil, err
		}
	}
	for _, s := range segs[:len(segs)-1] { // sealed: read through the cache
		st.fds.put(s, s.f)
		s.f = nil
	}
	return newQueue(st, id, qdir, segs, ret), nil
}

// recoverSealed loads the index of a sealed segment and checks its tail;
// if either fails, or WithVerify is on, it reads the whole segment, where
// a bad frame is ErrCorrupt, and rewrites the index.
func (st *Store) recoverSealed(s *segment, size int64, hasIndex bool, qdir string, key frameKey) error {
	if hasIndex && !st.cfg.verify {
		iname := indexName(qdir, s.base)
		b, err := readBounded(st.root, iname, indexHeader+4+8*(size/frameHeaderV1+1))
		if err == nil {
			err = decodeIndex(s, b, size, key)
		}
		if err == nil {
			if _, err = checkTail(s, st.cfg.maxFrameBytes, key, &st.scanBuf); err == nil {
				return nil
			}
		}
		st.cfg.log.Warn("ferry: filestore: rebuilding index", "file", iname, "err", err)
	}
	*s = segment{name: s.name, f: s.f, base: s.base, next: s.base}
	pos, err := scanSegment(s.f, s, size, st.cfg.maxFrameBytes, st.cfg.indexInterval, key, &st.scanBuf, nil)
	if err != nil {
		return fmt.Errorf("%w (%s at byte %d of %d, not the newest segment)", err, s.name, pos, size)
	}
	if hasIndex && st.cfg.verify {
		chk := segment{base: s.base}
		if b, err := readBounded(st.root, indexName(qdir, s.base), indexHeader+4+8*(size/frameHeaderV1+1)); err == nil && decodeIndex(&chk, b, size, key) == nil &&
			chk.next == s.next && chk.sizeSum == s.sizeSum && slices.Equal(chk.index, s.index) {
			return nil
		}
	}
	iname := indexName(qdir, s.base)
	if err := st.files.writeFileRename(iname, encodeIndex(s, key.tag), false); err != nil {
		return err
	}
	st.recovery.RebuiltIndexes = append(st.recovery.RebuiltIndexes, iname)
	return nil
}

// recoverNewest reads the newest segment of a queue and cuts it at the
// first torn or bad frame; damage (see judgeTail) is refused unless
// WithRepair.
func (st *Store) recoverNewest(id ferry.QueueID, s *segment, size int64, hasIndex bool, qdir string, key frameKey) error {
	v, err := scanNewest(s.f, s, size, st.cfg.maxFrameBytes, st.cfg.indexInterval, key, &st.scanBuf, nil)
	if err != nil {
		return err
	}
	if v != nil {
		pos := v.at
		tr := Truncation{Queue: id, File: s.name, At: pos, Cut: size - pos, Err: v.err, Damaged: v.kind == tailDamage, Dropped: v.dropped}
		if tr.Damaged {
			if !st.cfg.repair && v.first < 0 {
				return fmt.Errorf("%w (%s at byte %d of %d; nothing was cut: Open WithRepair cuts the segment there)", v.err, s.name, pos, size)
			}
			if !st.cfg.repair {
				return fmt.Errorf("%w (%s at byte %d of %d; %s, so nothing was cut; Open WithRepair cuts the segment there and drops them)",
					v.err, s.name, pos, size, v.what())
			}
			tr.Saved = s.name + ".corrupt"
			if err := st.saveCut(s, pos, size, tr.Saved, qdir); err != nil {
				return err
			}
		}
		if err := st.files.truncate(s.f, pos); err != nil {
			return err
		}
		if err := st.files.sync(s.f); err != nil {
			return err
		}
		st.recovery.Truncated = append(st.recovery.Truncated, tr)
		if tr.Damaged {
			st.cfg.log.Error("ferry: filestore: repaired damage, dropping intact frames", "queue", id.String(), "file", s.name, "at", pos, "cut", size-pos, "dropped", v.dropped, "saved", tr.Saved, "err", v.err)
		} else {
			st.cfg.log.Warn("ferry: filestore: cut torn tail", "queue", id.String(), "file", s.name, "at", pos, "cut", size-pos, "err", v.err)
		}
	}
	if hasIndex { // written by a roll that did not finish; rewritten on the next
		if err := st.files.remove(indexName(qdir, s.base)); err != nil {
			return err
		}
		return st.files.syncDir(qdir)
	}
	return nil
}

// saveCut copies bytes [pos, size) of s's file to name, durably, before
// a repair cuts them.
func (st *Store) saveCut(s *segment, pos, size int64, name, qdir string) error {
	f, err := st.files.openFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = st.files.check(opWrite, name)
	if err == nil {
		_, err = io.Copy(f, io.NewSectionReader(s.f, pos, size-pos))
	}
	if err == nil {
		err = st.files.sync(f)
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	return st.files.syncDir(qdir)
}

// listSegments returns the base offsets of a queue directory's segment
// files (%020d.log), sorted, and those that have an index file
// (%020d.index); other names are not its business.
func listSegments(entries []fs.DirEntry) (bases []int64, indexes map[int64]bool) {
	indexes = map[int64]bool{}
	for _, e := range entries {
		n := e.Name()
		switch {
		case len(n) == 24 && strings.HasSuffix(n, ".log"):
			if b, err := strconv.ParseInt(n[:20], 10, 64); err == nil && b >= 0 {
				bases = append(bases, b)
			}
		case len(n) == 26 && strings.HasSuffix(n, ".index"):
			if b, err := strconv.ParseInt(n[:20], 10, 64); err == nil && b >= 0 {
				indexes[b] = true
			}
		}
	}
	slices.Sort(bases)
	return bases, indexes
}
