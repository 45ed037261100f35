package natsstore

import (
	"testing"

	"github.com/ferrymq/ferry"
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
	entry := func(off int64) backlogEntry { return backlogEntry{m: &ferry.EnhancedMessage{Offset: off}} }
	next, want := int64(0), int64(0)
	check := func() {
		t.Helper()
		if int64(len(b.buf)) != next-want {
			t.Fatalf("holds %d, want %d", len(b.buf), next-want)
		}
		for i, e := range b.buf {
			if e.m.Offset != want+int64(i) {
				t.Fatalf("entry %d is offset %d, want %d", i, e.m.Offset, want+int64(i))
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
		if b.arr[:cap(b.arr)][i].m != nil {
			t.Fatalf("slot %d still holds a message", i)
		}
	}
}
