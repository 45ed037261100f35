package codec_test

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleMessages() []*ferry.EnhancedMessage {
	now := time.Unix(1_700_000_000, 123456789)
	return []*ferry.EnhancedMessage{
		{},
		{Message: ferry.Message{Topic: "t"}},
		{
			Message: ferry.Message{
				Topic:   "orders",
				Key:     "customer-42",
				Tag:     "created",
				Headers: map[string]string{"trace": "abc", "": "empty-key", "empty-value": ""},
				Body:    []byte("hello, ferry"),
			},
			ID:            ferry.NewMessageID(now),
			BornUnixNano:  now.UnixNano(),
			Origin:        &ferry.Origin{Producer: "p-1", Host: "host-1"},
			Queue:         3,
			Offset:        1 << 40,
			StoreUnixNano: now.Add(time.Millisecond).UnixNano(),
		},
		{Message: ferry.Message{Topic: "big", Body: bytes.Repeat([]byte{0xab}, 70000)}, Offset: 0, Queue: 65535},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	for i, m := range sampleMessages() {
		b := codec.Append([]byte("prefix"), m)
		require.Len(t, b, len("prefix")+codec.Size(m), "message %d", i)
		got, n, err := codec.Decode(b[len("prefix"):])
		require.NoError(t, err, "message %d", i)
		assert.Equal(t, len(b)-len("prefix"), n)
		assert.Equal(t, m.ID, got.ID)
		assert.Equal(t, m.Topic, got.Topic)
		assert.Equal(t, m.Key, got.Key)
		assert.Equal(t, m.Tag, got.Tag)
		assert.Equal(t, m.Origin, got.Origin)
		assert.Equal(t, m.Queue, got.Queue)
		assert.Equal(t, m.Offset, got.Offset)
		assert.Equal(t, m.BornUnixNano, got.BornUnixNano)
		assert.Equal(t, m.StoreUnixNano, got.StoreUnixNano)
		assert.Equal(t, m.BornTime().IsZero(), got.BornTime().IsZero())
		if len(m.Headers) == 0 {
			assert.Empty(t, got.Headers)
		} else {
			assert.Equal(t, m.Headers, got.Headers)
		}
		assert.Equal(t, len(m.Body), len(got.Body))
		assert.True(t, bytes.Equal(m.Body, got.Body))
	}
}

func TestCodecDecodesConcatenated(t *testing.T) {
	var b []byte
	msgs := sampleMessages()
	for _, m := range msgs {
		b = codec.Append(b, m)
	}
	for i := range msgs {
		got, n, err := codec.Decode(b)
		require.NoError(t, err)
		assert.Equal(t, msgs[i].Topic, got.Topic)
		b = b[n:]
	}
	assert.Empty(t, b)
}

func TestCodecDoesNotAliasInput(t *testing.T) {
	m := sampleMessages()[2]
	b := codec.Append(nil, m)
	got, _, err := codec.Decode(b)
	require.NoError(t, err)
	for i := range b {
		b[i] = 0
	}
	assert.Equal(t, "orders", got.Topic)
	assert.Equal(t, "hello, ferry", string(got.Body))
	assert.Equal(t, "abc", got.Headers["trace"])
	assert.Equal(t, &ferry.Origin{Producer: "p-1", Host: "host-1"}, got.Origin)
}

// Decoded messages of one producer share one Origin, as the messages it
// sent do: an Origin per decoded message would undo the envelope's
// saving for every reader of a file or a stream.
func TestCodecSharesOrigins(t *testing.T) {
	decode := func(producer, host string) *ferry.EnhancedMessage {
		t.Helper()
		var o *ferry.Origin
		if producer != "" || host != "" {
			o = &ferry.Origin{Producer: producer, Host: host}
		}
		got, _, err := codec.Decode(codec.Append(nil, &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t"}, Origin: o}))
		require.NoError(t, err)
		return got
	}
	// The cache is direct-mapped with a random seed: two origins share a
	// slot 1 time in 32 and then evict each other, so the decodes of each
	// are taken one after the other (interleaved, the test failed 1 run
	// in 32).
	a1, a2 := decode("a", "h"), decode("a", "h")
	b1, b2 := decode("b", "h"), decode("b", "h")
	assert.Same(t, a1.Origin, a2.Origin)
	assert.Same(t, b1.Origin, b2.Origin)
	assert.Equal(t, ferry.Origin{Producer: "a", Host: "h"}, *a1.Origin)
	assert.Equal(t, ferry.Origin{Producer: "b", Host: "h"}, *b2.Origin)
	// Same strings split differently are another origin.
	assert.Equal(t, ferry.Origin{Producer: "ah", Host: ""}, *decode("ah", "").Origin)
	assert.Equal(t, ferry.Origin{Producer: "", Host: "ah"}, *decode("", "ah").Origin)

	none := decode("", "")
	assert.Nil(t, none.Origin)
	assert.Equal(t, "", none.ProducerName())
	assert.Equal(t, "", none.BornHost())
	assert.True(t, none.BornTime().IsZero())
	assert.True(t, none.StoreTime().IsZero())
}

func TestCodecRejectsTruncation(t *testing.T) {
	for _, m := range sampleMessages() {
		b := codec.Append(nil, m)
		for cut := 0; cut < len(b); cut++ {
			_, _, err := codec.Decode(b[:cut])
			require.ErrorIs(t, err, ferry.ErrCorrupt, "cut at %d of %d", cut, len(b))
		}
	}
}

func TestCodecRejectsBadInput(t *testing.T) {
	good := codec.Append(nil, sampleMessages()[2])
	badVersion := append([]byte{99}, good[1:]...)
	// A header count far beyond the input: must fail before allocating.
	hugeHeaders := append([]byte{codec.Version}, make([]byte, 16)...)
	hugeHeaders = append(hugeHeaders, 0, 0, 0x80, 0x80, 0x80, 0x80) // queue, offset, zero-ish times
	// Many valid (empty) headers, then a body length beyond the input.
	manyHeaders := append([]byte{codec.Version}, make([]byte, 16)...)
	manyHeaders = append(manyHeaders, 0, 0, 1, 1, 0, 0, 0, 0, 0)
	manyHeaders = binary.AppendUvarint(manyHeaders, 1<<14)
	manyHeaders = append(manyHeaders, make([]byte, 2<<14)...)
	manyHeaders = append(manyHeaders, 0x7f)
	cases := map[string][]byte{
		"many headers then bad body": manyHeaders,
		"empty":                      nil,
		"bad version":                badVersion,
		"huge headers":               append(append([]byte{codec.Version}, make([]byte, 16)...), 0, 0, 1, 1, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f),
		"huge length":                append(append([]byte{codec.Version}, make([]byte, 16)...), 0, 0, 1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f),
		"bad varint":                 append(append([]byte{codec.Version}, make([]byte, 16)...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		"queue too big":              append(append([]byte{codec.Version}, make([]byte, 16)...), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"garbage":                    hugeHeaders,
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := codec.Decode(b)
			require.ErrorIs(t, err, ferry.ErrCorrupt)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 100 {
				_, _, _ = codec.Decode(b)
			}
			runtime.ReadMemStats(&after)
			perCall := (after.TotalAlloc - before.TotalAlloc) / 100
			assert.LessOrEqual(t, perCall, uint64(len(b)+1024), "a corrupt input must fail before allocating what its lengths claim")
		})
	}
}

// A valid message of many repeated headers decodes into a small map: the
// allocation follows what is decoded, not the header count.
func TestCodecDecodeManyHeadersAllocatesLittle(t *testing.T) {
	b := append([]byte{codec.Version}, make([]byte, 16)...)
	b = append(b, 0, 0, 1, 1, 0, 0, 0, 0, 0)
	const nh = 1 << 16
	b = binary.AppendUvarint(b, nh)
	for range nh {
		b = append(b, 1, 'k', 1, 'v')
	}
	b = append(b, 0) // empty body
	m, n, err := codec.Decode(b)
	require.NoError(t, err)
	assert.Equal(t, len(b), n)
	assert.Equal(t, map[string]string{"k": "v"}, m.Headers)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		_, _, _ = codec.Decode(b)
	}
	runtime.ReadMemStats(&after)
	perCall := (after.TotalAlloc - before.TotalAlloc) / 10
	assert.LessOrEqual(t, perCall, uint64(2*len(b)+8192))
}

func FuzzDecode(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(codec.Append(nil, m))
	}
	f.Add([]byte{})
	f.Add([]byte(strings.Repeat("\xff", 40)))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := codec.Decode(b)
		if err != nil {
			require.ErrorIs(t, err, ferry.ErrCorrupt)
			require.Nil(t, m)
			return
		}
		require.LessOrEqual(t, n, len(b))
		require.LessOrEqual(t, len(m.Body), len(b))
		// What decodes re-encodes to bytes that decode to the same message.
		again, n2, err := codec.Decode(codec.Append(nil, m))
		require.NoError(t, err)
		require.Equal(t, codec.Size(m), n2)
		require.Equal(t, m.Topic, again.Topic)
		require.Equal(t, m.Body, again.Body)
		require.Equal(t, m.Offset, again.Offset)
	})
}

func BenchmarkCodec(b *testing.B) {
	m := sampleMessages()[2]
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = codec.Append(buf[:0], m)
		if _, _, err := codec.Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}
