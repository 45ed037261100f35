package filestore

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"

	"github.com/ferrymq/ferry"
)

// VerifyReport is what [Verify] found in a store's directory.
type VerifyReport struct {
	Topics, Queues, Segments int
	Frames, Messages         int64
	Bytes                    int64 // of segment files
	Cursors                  int
	// Problems lists what fails a check, in the order found.
	Problems []Problem
}

// Damaged reports whether a problem is damage (see [Problem]).
func (r VerifyReport) Damaged() bool {
	return slices.ContainsFunc(r.Problems, func(p Problem) bool { return p.Damage })
}

// Problem is one thing [Verify] found wrong. Damage is set for bytes that
// Open refuses or that lose messages (a bad frame in a sealed segment, a
// bad frame followed by intact ones, a bad cursor, metadata or identity
// file, a gap between segments); it is clear for what Open repairs by
// itself without losing an acknowledged message: a torn tail of the
// newest segment (while the owner runs: space reserved ahead of its
// writes, or a write in progress), an index to rebuild, a cursor outside
// its queue's range, to clamp.
type Problem struct {
	File   string // relative to the store's directory
	Offset int64  // byte in File; -1 when the whole file is concerned
	Err    string
	Damage bool
	// TornTail marks the bytes after the last frame of a queue's newest
	// segment that Open cuts, never damage: while the owner runs, space
	// reserved ahead of its writes or a write in progress; after a crash,
	// a torn tail.
	TornTail bool
}

func (p Problem) String() string {
	kind := "note"
	if p.Damage {
		kind = "DAMAGE"
	}
	if p.Offset < 0 {
		return fmt.Sprintf("%s: %s: %s", kind, p.File, p.Err)
	}
	return fmt.Sprintf("%s: %s at byte %d: %s", kind, p.File, p.Offset, p.Err)
}

// Verify checks every file of the store in dir without its lock and
// without writing anything, as [OpenReadOnly] reads: the identity file,
// each topic's metadata, every frame of every segment (checksum, tag,
// offsets, and each message's encoding), every index against its
// segment, and the cursor file. Of the options, [WithMaxFrameBytes]
// applies. Damage is reported in the report, not as an error; the error is
// for a directory it cannot read. It may run while the owner writes: a
// segment deleted meanwhile is skipped, and the end of a newest segment
// is judged as Open judges it, a torn tail or damage, telling the owner's
// writes in progress from either (see judgeTail in tail.go): a live
// store's tails are [Problem.TornTail] notes, never damage.
func Verify(dir string, opts ...Option) (VerifyReport, error) {
	var r VerifyReport
	st, err := OpenReadOnly(dir, opts...)
	if err != nil {
		if errors.Is(err, ferry.ErrCorrupt) {
			r.Problems = append(r.Problems, Problem{File: storeFile, Offset: -1, Err: err.Error(), Damage: true})
			return r, nil
		}
		return r, err
	}
	defer st.Close()
	v := verifier{st: st, r: &r}
	if err := v.run(); err != nil {
		return r, &ferry.Error{Op: fmt.Sprintf("filestore: verify %s", dir), Err: err}
	}
	return r, nil
}

type verifier struct {
	st  *ReadOnlyStore
	r   *VerifyReport
	buf []byte
	// oldest and next offset of each queue, for the cursors; none for a
	// queue whose newest segment is damaged
	ranges map[ferry.QueueID][2]int64
}

func (v *verifier) problem(file string, off int64, damage bool, format string, args ...any) {
	v.r.Problems = append(v.r.Problems, Problem{File: file, Offset: off, Err: fmt.Sprintf(format, args...), Damage: damage})
}

func (v *verifier) run() error {
	v.ranges = map[ferry.QueueID][2]int64{}
	root := v.st.root
	topics, err := fs.ReadDir(root.FS(), "topics")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, te := range topics {
		name := te.Name()
		if !te.IsDir() || ferry.ValidateTopicName(name) != nil {
			continue
		}
		v.r.Topics++
		tdir := path.Join("topics", name)
		if _, ok, err := readMetaFile(root, tdir, name); err != nil {
			v.problem(path.Join(tdir, "meta"), -1, true, "%v", err)
		} else if !ok {
			v.problem(path.Join(tdir, "meta"), -1, false, "missing: the topic is not listed until a broker creates it again")
		}
		qs, err := fs.ReadDir(root.FS(), tdir)
		if err != nil {
			return err
		}
		for _, qe := range qs {
			i, err := strconv.Atoi(qe.Name())
			if !qe.IsDir() || err != nil || i < 0 || i >= ferry.MaxQueues || strconv.Itoa(i) != qe.Name() {
				continue
			}
			if err := v.queue(ferry.QueueID{Topic: name, Queue: i}, path.Join(tdir, qe.Name())); err != nil {
				return err
			}
		}
	}
	return v.cursors()
}

func (v *verifier) queue(id ferry.QueueID, qdir string) error {
	v.r.Queues++
	root := v.st.root
	entries, err := fs.ReadDir(root.FS(), qdir)
	if err != nil {
		return err
	}
	bases, indexes := listSegments(entries)
	key := frameKey{tag: queueTag(v.st.id, id.Topic, id.Queue), legacy: v.st.legacy}
	cfg := &v.st.cfg
	var prev *segment
	var oldest int64 = -1
	damaged := false // the queue's range is not known past damage
	for i, base := range bases {
		newest := i == len(bases)-1
		s := &segment{name: segmentName(qdir, base), base: base, next: base}
		f, err := root.Open(s.name)
		if errors.Is(err, fs.ErrNotExist) { // retention, meanwhile
			continue
		}
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return err
		}
		size := fi.Size()
		v.r.Segments++
		v.r.Bytes += size
		if prev != nil && prev.next != base {
			v.problem(s.name, -1, true, "starts at offset %d, the segment before it ends at %d", base, prev.next)
		}
		var frames, msgs int64
		var dec []*ferry.EnhancedMessage
		visit := func(fi frameInfo, enc []byte) error {
			var err error
			if dec, err = decodeMessages(dec[:0], fi, enc, fi.base, id.Queue); err != nil {
				return err
			}
			frames++
			msgs += int64(fi.count)
			return nil
		}
		var serr error
		if newest {
			var t *tailVerdict
			t, serr = scanNewest(f, s, size, cfg.maxFrameBytes, cfg.indexInterval, key, &v.buf, visit)
			switch {
			case serr != nil:
				_ = f.Close()
				return serr
			case t != nil && t.kind == tailDamage:
				v.problem(s.name, t.at, true, "%v; %s (Open refuses the store; Open WithRepair cuts the segment there)", t.err, t.what())
				serr, damaged = t.err, true
			case t != nil:
				v.r.Problems = append(v.r.Problems, Problem{File: s.name, Offset: t.at, TornTail: true,
					Err: fmt.Sprintf("torn tail of %d bytes after the last frame (space reserved or a write in progress while the owner runs; Open cuts it): %v", size-t.at, t.err)})
				serr = t.err
			}
		} else {
			var pos int64
			pos, serr = scanSegment(f, s, size, cfg.maxFrameBytes, cfg.indexInterval, key, &v.buf, visit)
			if serr != nil && !isCorrupt(serr) {
				_ = f.Close()
				return serr
			}
			if serr != nil {
				v.problem(s.name, pos, true, "%v (a sealed segment: messages from offset %d on are lost)", serr, s.next)
			}
		}
		v.r.Frames += frames
		v.r.Messages += msgs
		_ = f.Close()
		iname := indexName(qdir, base)
		switch {
		case newest && indexes[base]:
			v.problem(iname, -1, false, "index of the newest segment (a roll that did not finish; Open removes it)")
		case !newest && !indexes[base]:
			v.problem(iname, -1, false, "missing (Open rebuilds it)")
		case !newest && serr == nil:
			chk := segment{base: base}
			b, err := readBounded(root, iname, indexHeader+4+8*(size/frameHeaderV1+1))
			if err == nil {
				err = decodeIndex(&chk, b, size, key)
			}
			if err == nil && (chk.next != s.next || chk.sizeSum != s.sizeSum) {
				err = fmt.Errorf("describes offsets [%d, %d), the segment holds [%d, %d)", chk.base, chk.next, s.base, s.next)
			}
			if err == nil {
				for _, e := range chk.index {
					if j, ok := slices.BinarySearchFunc(s.index, e.off, func(x indexEntry, off int64) int { return int(x.off - off) }); !ok || s.index[j].pos != e.pos {
						if !v.frameAt(s, e) {
							err = fmt.Errorf("entry for offset %d points at byte %d, not at its frame", e.off, e.pos)
							break
						}
					}
				}
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				v.problem(iname, -1, false, "%v (Open rebuilds it)", err)
			}
		}
		if oldest < 0 {
			oldest = base
		}
		prev = s
	}
	switch {
	case damaged: // Open refuses the store: no cursor is clamped
	case prev != nil:
		v.ranges[id] = [2]int64{oldest, prev.next}
	default:
		v.ranges[id] = [2]int64{0, 0}
	}
	return nil
}

// frameAt reports whether the frames of s start a frame holding e.off at
// e.pos; s.index holds one entry per indexInterval, so an index written
// with another interval points at frames s.index does not list.
func (v *verifier) frameAt(s *segment, e indexEntry) bool {
	f, err := v.st.root.Open(s.name)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := newFrameScanner(f, e.pos, s.size, v.st.cfg.maxFrameBytes, frameKey{tag: 0, legacy: true})
	sc.bufSize = 64 << 10
	fi, _, err := sc.next()
	return (err == nil || errors.Is(err, errMisplaced)) && fi.base == e.off
}

func (v *verifier) cursors() error {
	m, err := v.st.readCursors()
	if errors.Is(err, ferry.ErrCorrupt) {
		v.problem(cursorFile, -1, true, "%v", err)
		return nil
	}
	if err != nil {
		return err
	}
	v.r.Cursors = len(m)
	keys := slices.SortedFunc(mapKeys(m), compareKeys)
	for _, k := range keys {
		rg, ok := v.ranges[ferry.QueueID{Topic: k.topic, Queue: k.queue}]
		if !ok {
			continue
		}
		if off := m[k]; off < rg[0] || off > rg[1] {
			v.problem(cursorFile, -1, false, "cursor of group %q on %s[%d] at %d, outside the retained [%d, %d] (Open clamps it)", k.group, k.topic, k.queue, off, rg[0], rg[1])
		}
	}
	return nil
}
