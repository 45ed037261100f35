// Package codec is Ferry's binary encoding of a message, for stores that
// keep messages as bytes (filestore's frames, natsstore's stream messages)
// and for brokers of your own: [Append] encodes, [Decode] reads back,
// [Size] is the length without encoding. The encoding is versioned
// ([Version]); bytes written by one version of Ferry are read by later
// ones.
package codec

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/ferrymq/ferry"
)

// Version is the first byte of every encoded message.
const Version = 1

// noTime encodes the zero time.Time.
const noTime = math.MinInt64

// Append appends the binary encoding of m to dst and returns the
// extended slice. The encoding is versioned: a version byte, the 16-byte ID,
// then varints and length-prefixed bytes. [Decode] reads it back.
func Append(dst []byte, m *ferry.EnhancedMessage) []byte {
	dst = append(dst, Version)
	dst = append(dst, m.ID[:]...)
	dst = binary.AppendUvarint(dst, uint64(m.Queue))
	dst = binary.AppendVarint(dst, m.Offset)
	dst = appendTime(dst, m.BornUnixNano)
	dst = appendTime(dst, m.StoreUnixNano)
	dst = appendString(dst, m.Topic)
	dst = appendString(dst, m.Key)
	dst = appendString(dst, m.Tag)
	dst = appendString(dst, m.BornHost())
	dst = appendString(dst, m.ProducerName())
	dst = binary.AppendUvarint(dst, uint64(len(m.Headers)))
	for k, v := range m.Headers {
		dst = appendString(dst, k)
		dst = appendString(dst, v)
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.Body)))
	return append(dst, m.Body...)
}

// Size returns len(Append(nil, m)) without encoding.
func Size(m *ferry.EnhancedMessage) int {
	n := 1 + len(m.ID) + uvarintLen(uint64(m.Queue)) + varintLen(m.Offset) +
		timeLen(m.BornUnixNano) + timeLen(m.StoreUnixNano) +
		strLen(m.Topic) + strLen(m.Key) + strLen(m.Tag) + strLen(m.BornHost()) + strLen(m.ProducerName()) +
		uvarintLen(uint64(len(m.Headers))) + uvarintLen(uint64(len(m.Body))) + len(m.Body)
	for k, v := range m.Headers {
		n += strLen(k) + strLen(v)
	}
	return n
}

// maxHeaderHint bounds the header count Decode trusts to size the map.
const maxHeaderHint = 64

// Decode decodes one message from the front of b and returns it with the
// number of bytes it used. Every length is checked against the bytes left
// before anything is allocated, so a corrupt input allocates nothing but
// its error, and a valid one about len(b) plus the headers' map; it
// returns an error wrapping [ferry.ErrCorrupt] and never panics. The message
// does not alias b.
func Decode(b []byte) (*ferry.EnhancedMessage, int, error) {
	d := decoder{b: b}
	m := new(ferry.EnhancedMessage)
	if v := d.byte(); d.err == nil && v != Version {
		return nil, 0, fmt.Errorf("%w: codec version %d, want %d", ferry.ErrCorrupt, v, Version)
	}
	copy(m.ID[:], d.bytes(len(m.ID)))
	q := d.uvarint()
	if q > math.MaxInt32 {
		d.fail("queue index out of range")
	}
	m.Queue = int(q)
	m.Offset = d.varint()
	m.BornUnixNano = d.time()
	m.StoreUnixNano = d.time()
	// The variable-length fields are copied into one allocation, which the
	// strings and the body share.
	start := d.off
	topic, key, tag := d.span(), d.span(), d.span()
	addr, prod := d.span(), d.span()
	nh := d.uvarint()
	if nh > uint64(len(d.b)-d.off)/2 { // each header takes at least 2 bytes
		d.fail("header count out of range")
	}
	hdrStart := d.off
	for i := uint64(0); i < nh && d.err == nil; i++ {
		d.span() // checked now, read again below once data holds the bytes
		d.span()
	}
	body := d.span()
	if d.err != nil {
		return nil, 0, d.err
	}
	data := make([]byte, d.off-start)
	copy(data, b[start:d.off])
	str := func(s [2]int) string {
		if s[1] == s[0] {
			return ""
		}
		return unsafe.String(&data[s[0]-start], s[1]-s[0])
	}
	m.Topic, m.Key, m.Tag = str(topic), str(key), str(tag)
	m.Origin = internOrigin(b[prod[0]:prod[1]], b[addr[0]:addr[1]])
	if nh > 0 {
		// The count hints the map's size only up to maxHeaderHint: a
		// million empty headers are one entry, not a million.
		m.Headers = make(map[string]string, min(nh, maxHeaderHint))
		h := decoder{b: b, off: hdrStart}
		for range nh {
			k, v := h.span(), h.span()
			m.Headers[str(k)] = str(v)
		}
	}
	if body[1] > body[0] {
		m.Body = data[body[0]-start : body[1]-start : body[1]-start]
	}
	return m, d.off, nil
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s at byte %d", ferry.ErrCorrupt, what, d.off)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil || d.off >= len(d.b) {
		d.fail("truncated")
		return 0
	}
	d.off++
	return d.b[d.off-1]
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || n > len(d.b)-d.off {
		d.fail("truncated")
		return nil
	}
	d.off += n
	return d.b[d.off-n : d.off]
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.off += n
	return v
}

// time reads a time in Unix nanoseconds; 0 for none.
func (d *decoder) time() int64 {
	v := d.varint()
	if d.err != nil || v == noTime {
		return 0
	}
	return v
}

// span reads a length-prefixed field and returns its [start, end) in b.
func (d *decoder) span() [2]int {
	n := d.uvarint()
	if d.err != nil {
		return [2]int{}
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail("length out of range")
		return [2]int{}
	}
	s := [2]int{d.off, d.off + int(n)}
	d.off += int(n)
	return s
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// appendTime appends a time in Unix nanoseconds, 0 meaning none.
func appendTime(dst []byte, ns int64) []byte {
	if ns == 0 {
		return binary.AppendVarint(dst, noTime)
	}
	return binary.AppendVarint(dst, ns)
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func varintLen(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}

func strLen(s string) int { return uvarintLen(uint64(len(s))) + len(s) }

func timeLen(ns int64) int {
	if ns == 0 {
		return varintLen(noTime)
	}
	return varintLen(ns)
}

// originCache holds decoded Origins, so that decoded messages of one
// producer share one as sent messages do, instead of each carrying its
// own: a direct-mapped table, one slot per hash of the producer and host.
var originCache [32]atomic.Pointer[ferry.Origin]

var originSeed = maphash.MakeSeed()

// internOrigin returns an ferry.Origin for producer and host (nil if both are
// empty), from originCache when it holds one, else a new one it caches.
// The ferry.Origin does not alias the arguments.
func internOrigin(producer, host []byte) *ferry.Origin {
	if len(producer) == 0 && len(host) == 0 {
		return nil
	}
	var h maphash.Hash
	h.SetSeed(originSeed)
	_, _ = h.Write(producer)
	_ = h.WriteByte(0)
	_, _ = h.Write(host)
	slot := &originCache[h.Sum64()%uint64(len(originCache))]
	if o := slot.Load(); o != nil && o.Producer == string(producer) && o.Host == string(host) {
		return o
	}
	o := &ferry.Origin{Producer: string(producer), Host: string(host)}
	slot.Store(o)
	return o
}
