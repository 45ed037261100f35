package filestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// fuzzMaxFrame bounds frames in the fuzz target.
const fuzzMaxFrame = 64 << 10

// testKey is the key of the queue the sample frames belong to.
var testKey = frameKey{tag: 0x0123456789abcdef}

func sampleFrame(base int64, n int) []byte {
	var enc []byte
	var sum int64
	now := time.Unix(1700000000, 123)
	for i := range n {
		m := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Key: "k", Headers: map[string]string{"h": "v"}, Body: []byte(fmt.Sprint("body ", i))},
			Offset: base + int64(i), StoreUnixNano: now.UnixNano()}
		enc = codec.Append(enc, m)
		sum += int64(m.Size())
	}
	return appendFrame(nil, testKey.tag, base, n, now.UnixNano(), sum, enc)
}

func TestFrameRoundTrip(t *testing.T) {
	b := sampleFrame(42, 3)
	fi, enc, err := decodeFrame(b, fuzzMaxFrame, testKey)
	require.NoError(t, err)
	assert.Equal(t, int64(42), fi.base)
	assert.Equal(t, 3, fi.count)
	assert.Equal(t, len(b), fi.totalLen)
	msgs, err := decodeMessages(nil, fi, enc, 43, 0)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	assert.Equal(t, "body 1", string(msgs[0].Body))

	// Every flipped bit, every cut, is detected.
	for i := range b {
		for bit := range 8 {
			c := bytes.Clone(b)
			c[i] ^= 1 << bit
			_, _, err := decodeFrame(c, fuzzMaxFrame, testKey)
			require.ErrorIs(t, err, ferry.ErrCorrupt, "byte %d bit %d", i, bit)
		}
	}
	for n := range len(b) {
		_, _, err := decodeFrame(b[:n], fuzzMaxFrame, testKey)
		require.ErrorIs(t, err, ferry.ErrCorrupt, "cut at %d", n)
		require.True(t, isShort(err) || n >= framePrefix, "cut at %d", n)
	}
	// The offset is covered by the checksum: the same frame moved is bad.
	b2 := bytes.Clone(b)
	b2[17]++ // base offset
	_, _, err = decodeFrame(b2, fuzzMaxFrame, testKey)
	require.ErrorIs(t, err, ferry.ErrCorrupt)
	// A frame of another queue is intact but misplaced; so is the tag
	// changed, which the checksum covers.
	_, _, err = decodeFrame(b, fuzzMaxFrame, frameKey{tag: testKey.tag + 1})
	require.ErrorIs(t, err, errMisplaced)
	b2 = bytes.Clone(b)
	b2[9]++
	_, _, err = decodeFrame(b2, fuzzMaxFrame, testKey)
	require.ErrorIs(t, err, ferry.ErrCorrupt)
	// A frame of version 1, untagged, is read only in a legacy store.
	v1 := appendFrameV1(42, 3)
	_, _, err = decodeFrame(v1, fuzzMaxFrame, testKey)
	require.ErrorIs(t, err, ferry.ErrCorrupt)
	fi, enc, err = decodeFrame(v1, fuzzMaxFrame, frameKey{tag: testKey.tag, legacy: true})
	require.NoError(t, err)
	assert.Equal(t, int64(42), fi.base)
	msgs, err = decodeMessages(nil, fi, enc, 42, 0)
	require.NoError(t, err)
	require.Len(t, msgs, 3)
	_, err = decodeMessages(nil, fi, enc, 42, 1)
	require.ErrorIs(t, err, ferry.ErrCorrupt, "a message of another queue")
	// Zeros are no frame.
	_, _, err = decodeFrame(make([]byte, 4096), fuzzMaxFrame, testKey)
	require.ErrorIs(t, err, ferry.ErrCorrupt)
	// A huge length is refused before anything is read or allocated.
	huge := bytes.Clone(b)
	huge[3] = 0x7f
	assert.Less(t, bytesAllocated(func() { _, _, _ = decodeFrame(huge, fuzzMaxFrame, testKey) }), uint64(1024))
}

// bytesAllocated returns the bytes f allocates, averaged over 100 runs.
func bytesAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / 100
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add(sampleFrame(0, 1))
	f.Add(sampleFrame(7, 4))
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		fi, enc, err := decodeFrame(b, fuzzMaxFrame, testKey)
		if err != nil {
			if !bytesIsCorrupt(err) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if fi.totalLen > len(b) || fi.totalLen > fuzzMaxFrame || fi.count < 1 || fi.count > len(enc) {
			t.Fatalf("accepted frame out of bounds: %+v of %d bytes", fi, len(b))
		}
		// A valid frame re-encodes to the same bytes.
		if got := appendFrame(nil, testKey.tag, fi.base, fi.count, fi.time, fi.sizeSum, enc); !bytes.Equal(got, b[:fi.totalLen]) {
			t.Fatalf("re-encoded frame differs")
		}
		msgs, err := decodeMessages(nil, fi, enc, fi.base, 0)
		if err != nil {
			if !bytesIsCorrupt(err) {
				t.Fatalf("message error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if len(msgs) != fi.count {
			t.Fatalf("%d messages of %d", len(msgs), fi.count)
		}
	})
}

func bytesIsCorrupt(err error) bool { return errors.Is(err, ferry.ErrCorrupt) }

// TestFuzzSeedCorpus checks that testdata/fuzz/FuzzDecodeFrame holds the
// seeds below; FILESTORE_WRITE_SEEDS=1 rewrites them first.
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeFrame")
	valid := sampleFrame(5, 3)
	flipped := bytes.Clone(valid)
	flipped[len(flipped)/2] ^= 0x10
	hugeLen := bytes.Clone(valid)
	hugeLen[3] = 0xff
	badCount := bytes.Clone(valid)
	badCount[framePrefix+17] = 0xff
	seeds := map[string]struct {
		b  []byte
		ok bool
	}{
		"valid":      {valid, true},
		"valid-one":  {sampleFrame(0, 1), true},
		"two-frames": {append(sampleFrame(0, 1), sampleFrame(1, 2)...), true},
		"torn":       {valid[:len(valid)-3], false},
		"flipped":    {flipped, false},
		"huge-len":   {hugeLen, false},
		"bad-count":  {badCount, false},
		"zeros":      {make([]byte, 128), false},
		"garbage":    {[]byte("\x29\x00\x00\x00garbage garbage garbage garbage garbage"), false},
	}
	for name, s := range seeds {
		data := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s.b)) + ")\n"
		path := filepath.Join(dir, name)
		if os.Getenv("FILESTORE_WRITE_SEEDS") != "" {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(path, []byte(data), 0o644))
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, data, string(got), name)
		_, _, err = decodeFrame(s.b, fuzzMaxFrame, testKey)
		assert.Equal(t, s.ok, err == nil, "%s: %v", name, err)
	}
}

// Every single-byte change or cut of an index or cursor file is refused
// (or, for an index, still describes the segment), never a panic.
func TestIndexAndCursorDecodersRefuseDamage(t *testing.T) {
	s := &segment{base: 100, next: 100}
	for i := range 50 {
		s.add(frameInfo{base: 100 + int64(i), count: 1, time: int64(i + 1), sizeSum: 10, totalLen: 300}, 1024)
	}
	b := encodeIndex(s, testKey.tag)
	got := &segment{base: 100}
	require.NoError(t, decodeIndex(got, b, s.size, testKey))
	assert.Equal(t, s.index, got.index)
	assert.Equal(t, s.next, got.next)
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x01
		assert.Error(t, decodeIndex(&segment{base: 100}, c, s.size, testKey), "byte %d", i)
	}
	for n := range len(b) {
		assert.Error(t, decodeIndex(&segment{base: 100}, b[:n], s.size, testKey), "cut at %d", n)
	}
	assert.Error(t, decodeIndex(&segment{base: 100}, b, s.size+1, testKey), "index of another size")
	assert.Error(t, decodeIndex(&segment{base: 100}, b, s.size, frameKey{tag: 1, legacy: true}), "index of another queue")

	st := &Store{id: [16]byte{1, 2, 3}}
	c := &cursorStore{st: st, m: map[cursorKey]int64{{"t", "g\xff", 1}: 5, {"u", "h", 0}: 7}}
	cb := c.encode()
	back := &cursorStore{st: st, m: map[cursorKey]int64{}}
	v1, err := back.decode(cb)
	require.NoError(t, err)
	assert.False(t, v1)
	assert.Equal(t, c.m, back.m)
	_, err = (&cursorStore{st: &Store{id: [16]byte{9}, legacy: true}, m: map[cursorKey]int64{}}).decode(cb)
	require.ErrorIs(t, err, ferry.ErrCorrupt, "a cursor file of another store")
	for i := range cb {
		d := bytes.Clone(cb)
		d[i] ^= 0x01
		_, err := (&cursorStore{st: st, m: map[cursorKey]int64{}}).decode(d)
		assert.ErrorIs(t, err, ferry.ErrCorrupt, "byte %d", i)
	}
	for n := range len(cb) {
		_, err := (&cursorStore{st: st, m: map[cursorKey]int64{}}).decode(cb[:n])
		assert.ErrorIs(t, err, ferry.ErrCorrupt, "cut at %d", n)
	}
}

// appendFrameV1 returns a frame of version 1 (no tag) of n messages of
// queue 0 from base, as stores wrote before the queue identity.
func appendFrameV1(base int64, n int) []byte {
	var enc []byte
	var sum int64
	for i := range n {
		m := &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Body: []byte(fmt.Sprint("old ", i))}, Offset: base + int64(i)}
		enc = codec.Append(enc, m)
		sum += int64(m.Size())
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(frameHeaderV1-framePrefix+len(enc)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(b, frameMagicV1)
	b = binary.LittleEndian.AppendUint64(b, uint64(base))
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = binary.LittleEndian.AppendUint64(b, 1)
	b = binary.LittleEndian.AppendUint64(b, uint64(sum))
	b = append(b, enc...)
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(b[framePrefix:], castagnoli))
	return b
}
