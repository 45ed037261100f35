package filestore

import (
	"errors"
	"fmt"
	"io"

	"github.com/ferrymq/ferry"
)

// What follows the intact frames of a queue's newest segment is judged
// here, once, for Open's recovery, [Verify] and the [ReadOnlyStore]
// alike: a torn tail, which Open cuts, or damage, which Open refuses.
//
// The rule, for a store nobody writes (Open holds the lock): a bad frame
// with nothing intact after it is a torn tail (an incomplete frame, zeros
// of space reserved and never written, garbage); one followed by an
// intact frame of this queue, or an intact frame of another queue
// itself, is damage.
//
// A reader without the lock reads a file its owner may be writing. The
// owner writes a segment front to back and never rewrites a byte it
// wrote: it appends frames, in order, into space it reserved (zeros) or
// past the end, through pwrite or a shared mapping of the page cache that
// pread reads too; only the undo of a failed write cuts the file back,
// and then the queue writes no more. So a live active segment is, at any
// moment, whole frames, then the write in progress, then zeros or the
// end; and a reader, which reads it piece by piece at different moments,
// sees any part of the write in progress (a later page of one pwrite may
// be new while an earlier one is still old). It may well meet a bad frame
// (zeros, half a frame) at pos and then, reading further a moment later,
// intact frames the owner wrote meanwhile after it: an intact frame after
// a bad one is no proof of damage by itself. But once an intact frame
// after pos has been read, the owner had written the bytes at pos before
// it (it writes in order, and the page cache is one copy that every
// reader sees), and they stay as written: reading them again now gives
// the frame the owner wrote, which passes every check. So judgeTail reads
// the frame at pos again once it found intact frames after it:
//
//   - it passes now: it was a write in progress (tailMoved), and the
//     caller reads on from it, within the same limit;
//   - it still fails: the owner did not write those bytes, it is damage
//     (as is a hole of zeros that a power loss left before frames that
//     reached the disk first, see the package doc) — unless the intact
//     frames were cut meanwhile (the undo of a failed write), which
//     judgeTail rules out by looking for them once more after the reread.
//
// For a store nobody writes the reread gives the same bytes, so the rule
// above is all there is. A judgement looks only at bytes below limit, the
// file's length when the caller's scan began: a snapshot whose bytes only
// become more whole while it is looked at.

// tailKind is what judgeTail found after the last intact frame.
type tailKind int

const (
	tailTorn   tailKind = iota + 1 // nothing intact follows the bad frame: Open cuts it
	tailDamage                     // intact frames follow, or it is another queue's: Open refuses the store
	tailMoved                      // the bad frame passes its checks now: it was being written
)

// tailVerdict is judgeTail's finding about the bad frame at at.
type tailVerdict struct {
	kind tailKind
	at   int64 // position of the bad frame
	err  error // what was wrong with it when first read
	// tailDamage: the messages in the intact frames after it and the
	// first one's offset; first is -1 when none follow (the bad frame is
	// an intact frame of another queue, topic or store).
	dropped, first int64
	// tailMoved: the frame at at, as read again (enc aliases a buffer of
	// its own).
	fi  frameInfo
	enc []byte
}

// what says why the bad frame is damage, for the error messages of Open,
// Verify and the read-only store.
func (v tailVerdict) what() string {
	if v.first < 0 {
		return "damage, not a torn tail"
	}
	return fmt.Sprintf("intact frames follow it, holding %d messages from offset %d: damage, not a torn tail", v.dropped, v.first)
}

// judgeTail judges the bad frame at at (its error bad) of the newest
// segment read from r, whose next frame should hold offset want, looking
// at bytes below limit (see the comment above). The error is for a failed
// read.
func judgeTail(r io.ReaderAt, at, limit, want int64, bad error, maxFrame int, key frameKey) (tailVerdict, error) {
	v := tailVerdict{at: at, err: bad, first: -1}
	found, dropped, first, err := intactAfter(r, at, limit, want, maxFrame, key)
	if err != nil {
		return v, err
	}
	if found {
		fi, enc, whole, err := wholeFrameAt(r, at, limit, want, maxFrame, key)
		if err != nil {
			return v, err
		}
		if whole {
			v.kind, v.fi, v.enc, v.dropped, v.first = tailMoved, fi, enc, dropped, first
			return v, nil
		}
		if found, dropped, first, err = intactAfter(r, at, limit, want, maxFrame, key); err != nil {
			return v, err
		}
	}
	switch {
	case found:
		v.kind, v.dropped, v.first = tailDamage, dropped, first
	case errors.Is(bad, errMisplaced):
		v.kind = tailDamage
	default:
		v.kind = tailTorn
	}
	return v, nil
}

// wholeFrameAt reads the frame at at of r again, below limit, and reports
// whether it is whole: it passes every check and holds offset want on.
// The error is for a failed read; a short one is a frame that is not
// whole.
func wholeFrameAt(r io.ReaderAt, at, limit, want int64, maxFrame int, key frameKey) (frameInfo, []byte, bool, error) {
	var prefix [framePrefix]byte
	if n, err := r.ReadAt(prefix[:], at); n < len(prefix) {
		return frameInfo{}, nil, false, readErr(err)
	}
	n, err := frameLen(prefix[:], maxFrame, limit-at)
	if err != nil {
		return frameInfo{}, nil, false, nil
	}
	b := make([]byte, n)
	if got, err := r.ReadAt(b, at); got < n {
		return frameInfo{}, nil, false, readErr(err)
	}
	fi, enc, err := decodeFrame(b, maxFrame, key)
	if err != nil || fi.base != want {
		return frameInfo{}, nil, false, nil
	}
	return fi, enc, true, nil
}

// readErr is a short read's error: nil at the end of the file.
func readErr(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// scanNewest reads the frames of a queue's newest segment from r with
// scanSegment (from s.size to limit, visit as there: called once for
// each frame accounted in s) and judges what follows the last intact one,
// reading on past a frame that was being written. It returns nil when the
// file ends with its last frame.
func scanNewest(r io.ReaderAt, s *segment, limit int64, maxFrame, interval int, key frameKey, buf *[]byte, visit func(frameInfo, []byte) error) (*tailVerdict, error) {
	for {
		pos, err := scanSegment(r, s, limit, maxFrame, interval, key, buf, visit)
		if err == nil {
			return nil, nil
		}
		if !isCorrupt(err) {
			return nil, fmt.Errorf("%s at byte %d: %w", s.name, pos, err)
		}
		v, jerr := judgeTail(r, pos, limit, s.next, err, maxFrame, key)
		if jerr != nil {
			return nil, fmt.Errorf("%s at byte %d: %w", s.name, pos, jerr)
		}
		if v.kind != tailMoved {
			return &v, nil
		}
		if visit != nil {
			if err := visit(v.fi, v.enc); err != nil { // whole, and intact frames follow
				v.kind, v.err = tailDamage, err
				return &v, nil
			}
		}
		s.add(v.fi, interval)
	}
}

// isCorrupt reports whether err is about the bytes read, not the reading.
func isCorrupt(err error) bool { return errors.Is(err, ferry.ErrCorrupt) }
