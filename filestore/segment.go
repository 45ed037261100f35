package filestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path"
	"sort"

	"github.com/ferrymq/ferry"
)

// A segment is one file of a queue's log, named by the offset of its first
// message (%020d.log), with a sparse index beside it (%020d.index) once it
// is sealed. The last segment of a queue is the active one, written to;
// the others are sealed and only read or deleted.
type segment struct {
	name      string // path of the .log file within the store's root
	f         *os.File
	base      int64 // offset of the first message
	next      int64 // one past the last message
	size      int64 // bytes of whole frames
	sizeSum   int64 // sum of Message.Size of the messages
	firstTime int64 // store time of the first frame, Unix ns; 0 when empty
	lastTime  int64 // store time of the last frame
	index     []indexEntry

	// The active segment's file is memory-mapped where possible (see
	// active.go). Both fields are written under wmu by the writer alone;
	// readers read the file with pread, never through mm.
	mm    []byte // the mapping, nil when the segment is written with pwrite
	alloc int64  // the file's length: size, or more when space is reserved
}

// indexEntry maps the first offset of a frame to the frame's position.
// A segment has one entry per indexInterval bytes, the first at 0.
type indexEntry struct {
	off int64
	pos int64
}

func (s *segment) count() int64 { return s.next - s.base }

// add accounts for a frame written at s.size.
func (s *segment) add(fi frameInfo, interval int) {
	if len(s.index) == 0 || s.size-s.index[len(s.index)-1].pos >= int64(interval) {
		s.index = append(s.index, indexEntry{off: fi.base, pos: s.size})
	}
	if s.firstTime == 0 {
		s.firstTime = fi.time
	}
	s.lastTime = fi.time
	s.next = fi.next()
	s.size += int64(fi.totalLen)
	s.sizeSum += fi.sizeSum
}

// lookup returns the position of the last indexed frame at or below off.
func (s *segment) lookup(off int64) indexEntry {
	i := sort.Search(len(s.index), func(i int) bool { return s.index[i].off > off })
	if i == 0 {
		return indexEntry{off: s.base}
	}
	return s.index[i-1]
}

func segmentName(dir string, base int64) string {
	return path.Join(dir, fmt.Sprintf("%020d.log", base))
}

func indexName(dir string, base int64) string {
	return path.Join(dir, fmt.Sprintf("%020d.index", base))
}

// frameScanner reads the frames of a file in order through a buffer, so a
// scan costs a read per megabyte, not one per frame.
type frameScanner struct {
	r        io.ReaderAt
	limit    int64 // bytes of the file to scan
	maxFrame int
	key      frameKey
	bufSize  int // minimum buffer; default 1 MiB
	buf      []byte
	bufPos   int64 // file position of buf[0]
	rd, wr   int   // buf[rd:wr] holds unread bytes
}

func newFrameScanner(r io.ReaderAt, from, limit int64, maxFrame int, key frameKey) *frameScanner {
	return &frameScanner{r: r, limit: limit, maxFrame: maxFrame, key: key, bufPos: from}
}

// pos returns the position of the next frame.
func (s *frameScanner) pos() int64 { return s.bufPos + int64(s.rd) }

// next returns the next frame, io.EOF at exactly limit, or an error
// wrapping ferry.ErrCorrupt (and errShort for a frame cut short).
func (s *frameScanner) next() (frameInfo, []byte, error) {
	avail := s.limit - s.pos()
	if avail == 0 {
		return frameInfo{}, nil, io.EOF
	}
	if avail < framePrefix {
		return frameInfo{}, nil, fmt.Errorf("%w: %d bytes left", errShort, avail)
	}
	if err := s.fill(framePrefix); err != nil {
		return frameInfo{}, nil, err
	}
	n, err := frameLen(s.buf[s.rd:s.wr], s.maxFrame, avail)
	if err != nil {
		return frameInfo{}, nil, err
	}
	if err := s.fill(n); err != nil {
		return frameInfo{}, nil, err
	}
	fi, enc, err := decodeFrame(s.buf[s.rd:s.rd+n], s.maxFrame, s.key)
	if err != nil {
		return frameInfo{}, nil, err
	}
	s.rd += n
	return fi, enc, nil
}

// fill makes buf[rd:] hold at least n bytes; n is already bounded by the
// frame maximum and the bytes left.
func (s *frameScanner) fill(n int) error {
	if s.wr-s.rd >= n {
		return nil
	}
	if s.rd > 0 {
		s.wr = copy(s.buf, s.buf[s.rd:s.wr])
		s.bufPos += int64(s.rd)
		s.rd = 0
	}
	if len(s.buf) < n {
		if s.bufSize == 0 {
			s.bufSize = 1 << 20
		}
		nb := make([]byte, max(n, s.bufSize))
		copy(nb, s.buf[:s.wr])
		s.buf = nb
	}
	want := int(min(int64(len(s.buf)), s.limit-s.bufPos))
	got, err := s.r.ReadAt(s.buf[s.wr:want], s.bufPos+int64(s.wr))
	s.wr += got
	if s.wr < n {
		if err == nil || errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: file shorter than expected", errShort)
		}
		return err
	}
	return nil
}

// scanSegment reads the frames of s's file from r, from s.size (s
// describes the frames before it: for a fresh scan only base, name and
// next = base are set) to limit, checking checksums and that offsets run
// on without a gap, and accounts for them in s. visit, if not nil, checks
// each frame's messages too (its error stops the scan like a bad frame).
// It stops at limit bytes, or at the first bad frame, whose error it
// returns with the frame's position; s then describes the good prefix.
// An error that does not wrap [ferry.ErrCorrupt] is a failed read.
//
// buf is the scan buffer, shared by the scans of one recovery and kept
// there (grown if a frame needs more).
func scanSegment(r io.ReaderAt, s *segment, limit int64, maxFrame, interval int, key frameKey, buf *[]byte, visit func(frameInfo, []byte) error) (int64, error) {
	sc := newFrameScanner(r, s.size, limit, maxFrame, key)
	sc.buf = *buf
	defer func() { *buf = sc.buf }()
	for {
		pos := sc.pos()
		fi, enc, err := sc.next()
		if err == io.EOF {
			return pos, nil
		}
		if err == nil {
			err = checkFrame(s, fi, enc, visit)
		}
		if err != nil {
			return pos, err
		}
		s.add(fi, interval)
	}
}

// checkFrame checks that an intact frame holds s's next offsets, and its
// messages with visit when not nil.
func checkFrame(s *segment, fi frameInfo, enc []byte, visit func(frameInfo, []byte) error) error {
	if fi.base != s.next {
		return fmt.Errorf("%w: frame holds offset %d, want %d", errBadFrame, fi.base, s.next)
	}
	if visit != nil {
		return visit(fi, enc)
	}
	return nil
}

var errBadFrame = fmt.Errorf("%w: misplaced frame", ferry.ErrCorrupt)

// intactAfter looks in r (size bytes) for intact frames after a bad one at
// pos, in a segment whose next frame should hold offset want: frames that
// pass every check and hold offsets from want on, or frames of another
// queue. It reports whether it found any (none means that what follows
// pos is a torn tail: incomplete, zero or garbage; any, that the bad frame
// is damage, see judgeTail), how many messages this queue's intact frames
// hold and the first's offset. It reads the rest of the file once, in
// chunks, and checks a checksum only where a frame's fixed fields make
// sense. A file shorter than size (cut meanwhile) ends the search there.
func intactAfter(r io.ReaderAt, pos, size, want int64, maxFrame int, key frameKey) (found bool, msgs, first int64, err error) {
	const chunk = 1 << 20
	win := make([]byte, min(chunk+frameHeader, max(size-pos, 0)))
	first = -1
	for from := pos + 1; from+frameHeaderV1 <= size; {
		at, err := findFrame(r, win, from, size, want, maxFrame, chunk, key)
		if err != nil || at < 0 {
			return found, msgs, first, err
		}
		found = true
		// Whole frames from there on, until the end or the next bad one.
		sc := newFrameScanner(r, at, size, maxFrame, key)
		sc.bufSize = 64 << 10
		next := want
		for {
			fi, _, err := sc.next()
			if err != nil || fi.base < next {
				break
			}
			if first < 0 {
				first = fi.base
			}
			msgs += int64(fi.count)
			next = fi.next()
		}
		from, want = max(sc.pos(), at)+1, next
	}
	return found, msgs, first, nil
}

// findFrame returns the position of the first intact frame at or after
// from holding offsets from want on (or written by another queue), or -1.
// It looks only where the version byte is one this queue reads.
func findFrame(r io.ReaderAt, win []byte, from, size, want int64, maxFrame, chunk int, key frameKey) (int64, error) {
	for c := from; c+frameHeaderV1 <= size; c += int64(chunk) {
		n, err := r.ReadAt(win[:min(int64(len(win)), size-c)], c)
		if err != nil && !errors.Is(err, io.EOF) {
			return -1, err
		}
		for i := 0; i+frameHeaderV1 <= n && i < chunk; i++ {
			// Skip to the next version byte (at framePrefix in a frame).
			j := nextMagic(win[i+framePrefix:n-frameHeaderV1+framePrefix+1], key.legacy)
			if j < 0 || i+j >= chunk {
				break
			}
			i += j
			b := win[i:n]
			var fields []byte
			switch {
			case b[framePrefix] == frameMagic && len(b) >= frameHeader:
				fields = b[framePrefix+9:]
			case b[framePrefix] == frameMagicV1 && key.legacy:
				fields = b[framePrefix+1:]
			default:
				continue
			}
			l := int64(binary.LittleEndian.Uint32(b))
			base := int64(binary.LittleEndian.Uint64(fields))
			count := int64(binary.LittleEndian.Uint32(fields[8:]))
			p := c + int64(i)
			if l < frameHeaderV1-framePrefix || l+framePrefix > int64(maxFrame) || p+l+framePrefix > size ||
				base < want || base-want > size || count < 1 || count > l {
				continue
			}
			fb := make([]byte, l+framePrefix)
			if got, err := r.ReadAt(fb, p); got < len(fb) {
				if err != nil && !errors.Is(err, io.EOF) {
					return -1, err
				}
				continue // cut meanwhile
			}
			if fi, _, err := decodeFrame(fb, maxFrame, key); (err == nil || errors.Is(err, errMisplaced)) && fi.base == base {
				return p, nil
			}
		}
		if n < len(win) && int64(n) < size-c { // the file ends before size
			return -1, nil
		}
	}
	return -1, nil
}

// nextMagic returns the index of the first byte of b that is a frame
// version this queue reads (the version of a legacy store too), or -1.
func nextMagic(b []byte, legacy bool) int {
	i := bytes.IndexByte(b, frameMagic)
	if legacy {
		if j := bytes.IndexByte(b, frameMagicV1); j >= 0 && (i < 0 || j < i) {
			i = j
		}
	}
	return i
}

// checkTail reads the frames of a sealed segment from its last index entry
// to its end, checking that they run on without a gap and end at s.next.
func checkTail(s *segment, maxFrame int, key frameKey, buf *[]byte) (int64, error) {
	e := indexEntry{off: s.base}
	if len(s.index) > 0 {
		e = s.index[len(s.index)-1]
	}
	sc := newFrameScanner(s.f, e.pos, s.size, maxFrame, key)
	sc.buf = *buf
	defer func() { *buf = sc.buf }()
	want := e.off
	for {
		pos := sc.pos()
		fi, _, err := sc.next()
		if err == io.EOF {
			if want != s.next {
				return pos, fmt.Errorf("%w: segment ends at offset %d, want %d", ferry.ErrCorrupt, want, s.next)
			}
			return pos, nil
		}
		if err == nil && fi.base != want {
			err = fmt.Errorf("%w: frame holds offset %d, want %d", errBadFrame, fi.base, want)
		}
		if err != nil {
			return pos, err
		}
		want = fi.next()
	}
}

// The index file of a sealed segment:
//
//	"FIDX" u32 version (2), u64 tag of the queue (queueTag), then u64
//	base, next, size, sizeSum, firstTime, lastTime, u32 entry count,
//	entries (u32 offset - base, u32 position), and a CRC-32C of
//	everything before it.
//
// Version 1, without the tag, is read in stores upgraded from it. It is
// written once, when the segment is sealed, and rebuilt from the segment
// whenever it fails any check (one copied from another queue included).
const (
	indexMagic    = "FIDX"
	indexHeader   = 4 + 4 + 8 + 6*8 + 4
	indexHeaderV1 = 4 + 4 + 6*8 + 4
)

func encodeIndex(s *segment, tag uint64) []byte {
	b := make([]byte, 0, indexHeader+8*len(s.index)+4)
	b = append(b, indexMagic...)
	b = binary.LittleEndian.AppendUint32(b, 2)
	b = binary.LittleEndian.AppendUint64(b, tag)
	for _, v := range []int64{s.base, s.next, s.size, s.sizeSum, s.firstTime, s.lastTime} {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.index)))
	for _, e := range s.index {
		b = binary.LittleEndian.AppendUint32(b, uint32(e.off-s.base))
		b = binary.LittleEndian.AppendUint32(b, uint32(e.pos))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeIndex fills s (whose base and file size are known) from an index
// file's bytes, checking every field against s and key.
func decodeIndex(s *segment, b []byte, fileSize int64, key frameKey) error {
	if len(b) < indexHeaderV1+4 || string(b[:4]) != indexMagic {
		return errors.New("bad index header")
	}
	if crc32.Checksum(b[:len(b)-4], castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return errors.New("bad index checksum")
	}
	hdr := indexHeader
	switch v := binary.LittleEndian.Uint32(b[4:]); {
	case v == 2 && len(b) >= indexHeader+4:
		if tag := binary.LittleEndian.Uint64(b[8:]); tag != key.tag {
			return fmt.Errorf("index of another queue (tag %016x, this queue's %016x)", tag, key.tag)
		}
	case v == 1 && key.legacy:
		hdr = indexHeaderV1
	default:
		return fmt.Errorf("bad index version %d", v)
	}
	f := b[hdr-4-6*8:]
	var v [6]int64
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(f[8*i:]))
	}
	base, next, size, sizeSum, first, last := v[0], v[1], v[2], v[3], v[4], v[5]
	n := int(binary.LittleEndian.Uint32(b[hdr-4:]))
	if n != (len(b)-hdr-4)/8 || (len(b)-hdr-4)%8 != 0 {
		return errors.New("bad index entry count")
	}
	if base != s.base || size != fileSize || next < base || sizeSum < 0 || (next > base) != (n > 0) || (n == 0) != (size == 0) {
		return fmt.Errorf("index describes offsets [%d, %d) in %d bytes, file has %d", base, next, size, fileSize)
	}
	idx := make([]indexEntry, n)
	for i := range idx {
		e := indexEntry{
			off: base + int64(binary.LittleEndian.Uint32(b[hdr+8*i:])),
			pos: int64(binary.LittleEndian.Uint32(b[hdr+8*i+4:])),
		}
		if i == 0 && (e.off != base || e.pos != 0) ||
			i > 0 && (e.off <= idx[i-1].off || e.pos <= idx[i-1].pos) ||
			e.off >= next || e.pos >= size {
			return fmt.Errorf("bad index entry %d", i)
		}
		idx[i] = e
	}
	s.next, s.size, s.sizeSum, s.firstTime, s.lastTime, s.index = next, size, sizeSum, first, last, idx
	return nil
}
