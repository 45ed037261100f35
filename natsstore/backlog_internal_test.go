package natsstore

import (
	"context"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

func TestAckSeqPending(t *testing.T) {
	for _, c := range []struct {
		reply        string
		seq, pending uint64
		ok           bool
	}{
		{"$JS.ACK.S.C.1.42.7.1700000000000000000.9", 42, 9, true},
		{"$JS.ACK._.HASH.S.C.1.42.7.1700000000000000000.9.tok", 42, 9, true},
		{"$JS.ACK.dom.HASH.S.C.1.18446744073709551615.7.1700000000000000000.0", 18446744073709551615, 0, true},
		{"$JS.ACK.dom.HASH.S.C.1.42.7.1700000000000000000.0.a.b", 42, 0, true},
		{"$JS.ACK.S.C.1.42.7.1700000000000000000", 0, 0, false},     // a token short
		{"$JS.ACK.x.S.C.1.42.7.1700000000000000000.9", 0, 0, false}, // 8 tokens
		{"$JS.ACK.S.C.1.4x.7.1700000000000000000.9", 0, 0, false},
		{"$JS.ACK.S.C.1.42.7.1700000000000000000.", 0, 0, false},
		{"_INBOX.abc", 0, 0, false},
		{"", 0, 0, false},
	} {
		seq, pending, ok := ackSeqPending(c.reply)
		if ok != c.ok || ok && (seq != c.seq || pending != c.pending) {
			t.Errorf("ackSeqPending(%q) = %d, %d, %v; want %d, %d, %v", c.reply, seq, pending, ok, c.seq, c.pending, c.ok)
		}
	}
}

// TestBacklogKeepReuses: a backlog whose Reads keep up reuses its array,
// and one the Reads fall behind grows it, keeping every entry in order.
func TestBacklogKeepReuses(t *testing.T) {
	b := &backlog{}
	entry := func(off int64) backlogEntry { return backlogEntry{data: []byte{1}, off: off} }
	next, want := int64(0), int64(0)
	check := func() {
		t.Helper()
		if int64(len(b.buf)) != next-want {
			t.Fatalf("holds %d, want %d", len(b.buf), next-want)
		}
		for i, e := range b.buf {
			if e.off != want+int64(i) {
				t.Fatalf("entry %d is offset %d, want %d", i, e.off, want+int64(i))
			}
		}
	}
	for range 100 { // grow to 64, then keep up
		b.keepLocked(entry(next))
		next++
	}
	check()
	var arr *backlogEntry
	for round := range 2000 {
		if round == 1000 { // grown to fit by now
			arr = &b.arr[:1][0]
		}
		for range 10 + round%7 {
			b.keepLocked(entry(next))
			next++
		}
		k := min(len(b.buf), 11+round%5)
		if round%100 == 99 {
			k = len(b.buf) // the Reads take all
		}
		b.dropLocked(k)
		want += int64(k)
		check()
	}
	if &b.arr[:1][0] != arr || cap(b.arr) > 256 {
		t.Errorf("a backlog the Reads keep up with grew a new array (of %d)", cap(b.arr))
	}
	for range 1000 { // the Reads fall behind
		b.keepLocked(entry(next))
		next++
	}
	check()
	if cap(b.arr) < len(b.buf) {
		t.Errorf("array of %d holds %d", cap(b.arr), len(b.buf))
	}
	b.dropLocked(len(b.buf))
	want = next
	check()
	for i := range b.arr[:cap(b.arr)] {
		if b.arr[:cap(b.arr)][i].data != nil {
			t.Fatalf("slot %d still holds a message", i)
		}
	}
}

// TestDecodeBacklog: the records a backlog reader served are decoded at
// their offsets; an undecodable one serves nothing and stops the reader,
// so that the Read gets (and tells).
func TestDecodeBacklog(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := &backlog{cancel: cancel}
	q := &queue{id: ferry.QueueID{Topic: "t", Queue: 2}, bl: b}
	good := func(off int64, body string) backlogEntry {
		return backlogEntry{off: off, data: codec.Append(nil, &ferry.EnhancedMessage{Message: ferry.Message{Topic: "t", Body: []byte(body)}})}
	}
	dst := make([]*ferry.EnhancedMessage, 3)
	n := q.decodeBacklog(b, []backlogEntry{good(40, "a"), good(41, "b")}, dst)
	if n != 2 || dst[0].Offset != 40 || dst[1].Offset != 41 || dst[1].Queue != 2 || string(dst[1].Body) != "b" {
		t.Fatalf("decoded %d: %+v %+v", n, dst[0], dst[1])
	}
	clear(dst)
	n = q.decodeBacklog(b, []backlogEntry{good(42, "c"), {off: 43, data: []byte{0xff, 1, 2}}, good(44, "e")}, dst)
	if n != 0 || dst[0] != nil {
		t.Fatalf("an undecodable record: served %d (%v)", n, dst[0])
	}
	if q.bl != nil || ctx.Err() == nil {
		t.Fatal("an undecodable record left the reader running")
	}
}
