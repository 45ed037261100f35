package filestore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// A frame is one batch of messages on disk, the unit of writing,
// checksumming and recovery:
//
//	off  size
//	  0     4  length L of the bytes after the first 8 (little endian)
//	  4     4  CRC-32C (Castagnoli) of those L bytes
//	  8     1  frame version (frameMagic)
//	  9     8  tag: the identity of the queue that wrote it (queueTag)
//	 17     8  offset of the first message
//	 25     4  message count, at least 1
//	 29     8  store time of the batch, Unix nanoseconds
//	 37     8  sum of Message.Size over the batch
//	 45     -  the messages, each in the ferry codec, back to back
//
// The checksum covers the tag and the offsets, so a frame copied to the
// wrong place (another offset, queue, topic or store), or stale bytes left
// behind a cut, fail a check: a wrong tag behind a good checksum is
// errMisplaced. A zero-filled tail fails the length bound (L = 0 is below
// the minimum), so zeros never decode as records.
//
// Version 1 (frameMagicV1), written before the tag, has no tag: the
// fields from offset 9 on come 8 bytes earlier, the messages at 37. It is
// read in stores upgraded from it ([frameKey].legacy), never written.
const (
	framePrefix   = 8
	frameHeader   = 45 // prefix plus fixed fields
	frameHeaderV1 = 37
	frameMagic    = 0xF2
	frameMagicV1  = 0xF1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errShort reports a frame that runs past the bytes available: a torn
// write at the end of a segment, or a length field out of bounds.
var errShort = fmt.Errorf("%w: frame runs past the end", ferry.ErrCorrupt)

// errMisplaced reports an intact frame written by another queue.
var errMisplaced = fmt.Errorf("%w: frame written for another queue, topic or store", ferry.ErrCorrupt)

// frameKey is what a queue's frames must carry: its tag, and whether
// untagged frames of version 1 are read (a store upgraded from them).
type frameKey struct {
	tag    uint64
	legacy bool
}

// queueTag is the identity of a queue: FNV-1a (64 bits) of the store's
// ID, the topic and the queue index.
func queueTag(store [16]byte, topic string, queue int) uint64 {
	h := fnv.New64a()
	h.Write(store[:])
	h.Write([]byte(topic))
	h.Write([]byte{0})
	h.Write(binary.LittleEndian.AppendUint32(nil, uint32(queue)))
	return h.Sum64()
}

// frameInfo is a frame's fixed fields.
type frameInfo struct {
	base     int64 // offset of the first message
	count    int   // messages in the frame
	time     int64 // store time, Unix nanoseconds
	sizeSum  int64 // sum of Message.Size
	totalLen int   // bytes of the whole frame, prefix included
}

func (f frameInfo) next() int64 { return f.base + int64(f.count) }

// appendFrame appends a frame of the queue tagged tag holding the encoded
// messages enc (count of them) to dst.
func appendFrame(dst []byte, tag uint64, base int64, count int, storeTime, sizeSum int64, enc []byte) []byte {
	start := len(dst)
	l := frameHeader - framePrefix + len(enc)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(l))
	dst = binary.LittleEndian.AppendUint32(dst, 0) // CRC, filled below
	dst = append(dst, frameMagic)
	dst = binary.LittleEndian.AppendUint64(dst, tag)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(base))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(count))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(storeTime))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(sizeSum))
	dst = append(dst, enc...)
	crc := crc32.Checksum(dst[start+framePrefix:], castagnoli)
	binary.LittleEndian.PutUint32(dst[start+4:], crc)
	return dst
}

// frameLen reads the length field at the front of prefix (at least
// framePrefix bytes) and returns the whole frame's length, checked against
// maxFrame and avail (the bytes left in the file from the frame's start)
// before anything is allocated. A failure wraps errShort when the frame
// would run past avail, [ferry.ErrCorrupt] otherwise.
func frameLen(prefix []byte, maxFrame int, avail int64) (int, error) {
	l := int64(binary.LittleEndian.Uint32(prefix))
	if l < frameHeaderV1-framePrefix {
		return 0, fmt.Errorf("%w: frame length %d below minimum", ferry.ErrCorrupt, l)
	}
	if l+framePrefix > int64(maxFrame) {
		return 0, fmt.Errorf("%w: frame length %d above maximum %d", ferry.ErrCorrupt, l, maxFrame)
	}
	if l+framePrefix > avail {
		return 0, fmt.Errorf("%w: frame of %d bytes, %d left", errShort, l+framePrefix, avail)
	}
	return int(l) + framePrefix, nil
}

// decodeFrame checks the frame at the front of b (its length bounded by
// maxFrame and len(b)) against key and returns its fixed fields and its
// encoded messages, which alias b. Errors wrap [ferry.ErrCorrupt]; a frame
// cut short also wraps errShort, an intact frame of another queue
// errMisplaced (with its fields). It never panics and allocates nothing.
func decodeFrame(b []byte, maxFrame int, key frameKey) (frameInfo, []byte, error) {
	if len(b) < framePrefix {
		return frameInfo{}, nil, fmt.Errorf("%w: %d bytes, no frame prefix", errShort, len(b))
	}
	n, err := frameLen(b, maxFrame, int64(len(b)))
	if err != nil {
		return frameInfo{}, nil, err
	}
	body := b[framePrefix:n]
	if crc := crc32.Checksum(body, castagnoli); crc != binary.LittleEndian.Uint32(b[4:]) {
		return frameInfo{}, nil, fmt.Errorf("%w: frame checksum %08x, want %08x", ferry.ErrCorrupt, crc, binary.LittleEndian.Uint32(b[4:]))
	}
	hdr, fields, tag := frameHeader, body[9:], uint64(0)
	switch {
	case body[0] == frameMagic && n >= frameHeader:
		tag = binary.LittleEndian.Uint64(body[1:])
	case body[0] == frameMagicV1 && key.legacy:
		hdr, fields = frameHeaderV1, body[1:]
	case body[0] == frameMagicV1:
		return frameInfo{}, nil, fmt.Errorf("%w: frame of version 1, without the queue's identity, in a store that never wrote one", ferry.ErrCorrupt)
	default:
		return frameInfo{}, nil, fmt.Errorf("%w: frame version %#x", ferry.ErrCorrupt, body[0])
	}
	fi := frameInfo{
		base:     int64(binary.LittleEndian.Uint64(fields)),
		count:    int(binary.LittleEndian.Uint32(fields[8:])),
		time:     int64(binary.LittleEndian.Uint64(fields[12:])),
		sizeSum:  int64(binary.LittleEndian.Uint64(fields[20:])),
		totalLen: n,
	}
	msgs := b[hdr:n]
	if fi.base < 0 || fi.count < 1 || fi.count > len(msgs) || fi.sizeSum < 0 || fi.base > (1<<62) {
		return frameInfo{}, nil, fmt.Errorf("%w: frame fields out of range (offset %d, count %d)", ferry.ErrCorrupt, fi.base, fi.count)
	}
	if hdr == frameHeader && tag != key.tag {
		return fi, nil, fmt.Errorf("%w (offsets %d to %d, tag %016x, this queue's %016x)", errMisplaced, fi.base, fi.next()-1, tag, key.tag)
	}
	return fi, msgs, nil
}

// decodeMessages decodes the messages of a frame of queue (its index),
// appending to dst those at offset from and later. Each must carry the
// queue and the offset its place implies.
func decodeMessages(dst []*ferry.EnhancedMessage, fi frameInfo, enc []byte, from int64, queue int) ([]*ferry.EnhancedMessage, error) {
	off := 0
	for i := range fi.count {
		m, n, err := codec.Decode(enc[off:])
		if err != nil {
			return dst, fmt.Errorf("message %d of frame at offset %d: %w", i, fi.base, err)
		}
		off += n
		if want := fi.base + int64(i); m.Offset != want || m.Queue != queue {
			return dst, fmt.Errorf("%w: message of queue %d at offset %d in place of queue %d, offset %d", ferry.ErrCorrupt, m.Queue, m.Offset, queue, want)
		}
		if m.Offset >= from {
			dst = append(dst, m)
		}
	}
	if off != len(enc) {
		return dst, fmt.Errorf("%w: %d bytes after the last message of frame at offset %d", ferry.ErrCorrupt, len(enc)-off, fi.base)
	}
	return dst, nil
}

// isShort reports whether err marks a frame cut short.
func isShort(err error) bool { return errors.Is(err, errShort) }
