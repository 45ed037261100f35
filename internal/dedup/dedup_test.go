package dedup

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWindowLookupAndExpire(t *testing.T) {
	assert.Nil(t, New(0))
	assert.Nil(t, New(-1))
	w := New(10 * time.Nanosecond)
	w.Add(HashKey("a"), Entry{Offset: 0, ID: [16]byte{1}, Stored: 100})
	w.Add(HashKey("b"), Entry{Offset: 1, Stored: 105})
	e, ok := w.Lookup(HashKey("a"), 109)
	require.True(t, ok)
	assert.Equal(t, Entry{Offset: 0, ID: [16]byte{1}, Stored: 100}, e)
	_, ok = w.Lookup(HashKey("a"), 110)
	assert.False(t, ok, "a window old: not a duplicate any more")
	_, ok = w.Lookup(HashKey("c"), 100)
	assert.False(t, ok)

	w.Expire(110)
	assert.Equal(t, 2, w.Len(), "a's generation holds b, which is not a window old")
	_, ok = w.Lookup(HashKey("a"), 110)
	assert.False(t, ok)
	_, ok = w.Lookup(HashKey("b"), 110)
	assert.True(t, ok)
	// a again, stored anew; the drop of the old generation keeps it.
	w.Add(HashKey("a"), Entry{Offset: 2, Stored: 111})
	w.Expire(115)
	assert.Equal(t, 1, w.Len(), "the generation of a and b went")
	e, ok = w.Lookup(HashKey("a"), 115)
	require.True(t, ok)
	assert.Equal(t, int64(2), e.Offset)
	w.Expire(1000)
	assert.Equal(t, 0, w.Len())
}

// A key stored again after its first entry went stale keeps the new
// entry when the old one's generation goes.
func TestWindowReAddedKeySurvivesOldItem(t *testing.T) {
	w := New(10)
	_, dup := w.Put(HashKey("a"), Entry{Offset: 0, Stored: 0}, 0)
	require.False(t, dup)
	w.Expire(10) // a's generation becomes the old one
	_, dup = w.Put(HashKey("a"), Entry{Offset: 5, Stored: 10}, 10)
	require.False(t, dup, "a window old")
	w.Expire(12)
	w.Expire(19)
	e, ok := w.Lookup(HashKey("a"), 19)
	require.True(t, ok)
	assert.Equal(t, int64(5), e.Offset)
	e, dup = w.Put(HashKey("a"), Entry{Offset: 6, Stored: 19}, 19)
	require.True(t, dup)
	assert.Equal(t, int64(5), e.Offset)
}

func TestWindowRollback(t *testing.T) {
	w := New(time.Hour)
	w.Add(HashKey("a"), Entry{Offset: 0})
	m := w.Mark()
	_, dup := w.Put(HashKey("b"), Entry{Offset: 1}, 0)
	require.False(t, dup)
	_, dup = w.Put(HashKey("c"), Entry{Offset: 2}, 0)
	require.False(t, dup)
	_, dup = w.Put(HashKey("a"), Entry{Offset: 3}, 0)
	require.True(t, dup, "a duplicate adds nothing to roll back")
	w.Rollback(m)
	assert.Equal(t, 1, w.Len())
	_, ok := w.Lookup(HashKey("b"), 0)
	assert.False(t, ok)
	_, ok = w.Lookup(HashKey("a"), 0)
	assert.True(t, ok, "what was there before the mark stays")
	_, dup = w.Put(HashKey("b"), Entry{Offset: 1}, 0)
	assert.False(t, dup)
	assert.Equal(t, 2, w.Len())
}

// Memory stays bounded by what two windows hold: a long run of keys
// through a short window keeps only the recent ones.
func TestWindowBounded(t *testing.T) {
	w := New(100)
	for i := range 100_000 {
		now := int64(i)
		w.Expire(now)
		w.Mark()
		_, dup := w.Put(HashKey(strconv.Itoa(i)), Entry{Offset: int64(i), Stored: now}, now)
		require.False(t, dup)
		require.LessOrEqual(t, w.Len(), 2*100+1)
	}
	assert.LessOrEqual(t, len(w.cur.slots)+len(w.prev.slots), 2*256, "the tables keep the slots they need")
	w.Expire(1 << 40)
	assert.Zero(t, w.Len())
}

// The window against an exact model under random writes, lookups,
// rollbacks, window changes and a clock that mostly moves on but
// sometimes stands still or jumps: a key is a duplicate exactly when its
// entry was stored less than the window before now.
func TestWindowModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		w := New(50)
		model := map[Hash]Entry{}
		keys := make([]Hash, 40+rng.IntN(400))
		for i := range keys {
			keys[i] = HashKey(strconv.Itoa(i))
		}
		// unknown keys may or may not be remembered: their entry went
		// stale before the window grew, and may have been dropped.
		unknown := map[Hash]bool{}
		fresh := func(k Hash, now int64) (Entry, bool) {
			m, ok := model[k]
			return m, ok && now-m.Stored < int64(w.Duration())
		}
		now, off := int64(0), int64(0)
		for step := range 20_000 {
			switch r := rng.IntN(100); {
			case r < 2:
				now += int64(rng.IntN(300)) // a jump past a generation or two
			case r < 3:
				d := time.Duration(20 + rng.IntN(80))
				if d > w.Duration() {
					for k, m := range model {
						if now-m.Stored >= int64(w.Duration()) {
							unknown[k] = true
						}
					}
				}
				w.SetDuration(d)
			default:
				now += int64(rng.IntN(3))
			}
			w.Expire(now)
			if rng.IntN(4) == 0 {
				k := keys[rng.IntN(len(keys))]
				m, want := fresh(k, now)
				e, ok := w.Lookup(k, now)
				if unknown[k] {
					continue
				}
				require.Equal(t, want, ok, "seed %d step %d", seed, step)
				if want {
					require.Equal(t, m, e)
				}
				continue
			}
			// A write of a few keys, kept or rolled back.
			mark := w.Mark()
			undo := map[Hash]*Entry{}
			wasUnknown := map[Hash]bool{}
			batch := make([]Hash, 1+rng.IntN(4))
			for i := range batch {
				batch[i] = keys[rng.IntN(len(keys))]
			}
			if rng.IntN(2) == 0 {
				w.Warm(batch) // a batch's writer warms its keys first: nothing changes
			}
			for _, k := range batch {
				e := Entry{Offset: off, Stored: now}
				m, want := fresh(k, now)
				old, dup := w.Put(k, e, now)
				if unknown[k] {
					delete(unknown, k)
					wasUnknown[k] = true
					if dup {
						model[k] = old
						continue
					}
					want = false
				}
				require.Equal(t, want, dup, "seed %d step %d", seed, step)
				if dup {
					require.Equal(t, m, old)
					continue
				}
				if _, seen := undo[k]; !seen {
					if prev, ok := model[k]; ok {
						undo[k] = &prev
					} else {
						undo[k] = nil
					}
				}
				model[k] = e
				off++
			}
			if rng.IntN(5) == 0 {
				w.Rollback(mark)
				for k := range wasUnknown {
					unknown[k] = true
				}
				for k, prev := range undo {
					if prev == nil {
						delete(model, k)
					} else {
						model[k] = *prev // stale by now, or not: as Put found it
					}
				}
			}
		}
	}
}

func TestHashKey(t *testing.T) {
	assert.Equal(t, HashKey("a"), HashKey("a"))
	assert.NotEqual(t, HashKey("a"), HashKey("b"))
	assert.NotEqual(t, HashKey(""), HashKey("\x00"))
	seen := map[Hash]bool{}
	for i := range 100_000 {
		h := HashKey(strconv.Itoa(i))
		require.False(t, seen[h])
		seen[h] = true
	}
}

// BenchmarkWindow is a write's work per new key: expire, hash, put,
// with every key kept (a window longer than the run).
func BenchmarkWindow(b *testing.B) {
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = "order-" + strconv.Itoa(i)
	}
	w := New(time.Hour)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now := int64(i)
		w.Expire(now)
		w.Mark()
		if _, dup := w.Put(HashKey(keys[i]), Entry{Offset: int64(i), Stored: now}, now); dup {
			b.Fatal("duplicate")
		}
	}
}

// BenchmarkWindowSteady is BenchmarkWindow through a window of 100,000
// keys: the steady state of a stream longer than its window.
func BenchmarkWindowSteady(b *testing.B) {
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = "order-" + strconv.Itoa(i)
	}
	w := New(100_000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now := int64(i)
		w.Expire(now)
		w.Mark()
		if _, dup := w.Put(HashKey(keys[i]), Entry{Offset: int64(i), Stored: now}, now); dup {
			b.Fatal("duplicate")
		}
	}
}

// BenchmarkWindowPut is BenchmarkWindow's Put alone, of keys hashed
// before the timer: what a new key costs a window of b.N keys.
func BenchmarkWindowPut(b *testing.B) {
	hs := make([]Hash, b.N)
	for i := range hs {
		hs[i] = HashKey("order-" + strconv.Itoa(i))
	}
	w := New(time.Hour)
	b.ReportAllocs()
	b.ResetTimer()
	for i, h := range hs {
		now := int64(i)
		w.Expire(now)
		w.Mark()
		if _, dup := w.Put(h, Entry{Offset: int64(i), Stored: now}, now); dup {
			b.Fatal("duplicate")
		}
	}
}

// BenchmarkHashKey is the hash alone.
func BenchmarkHashKey(b *testing.B) {
	var h Hash
	for b.Loop() {
		h = HashKey("order-1234567")
	}
	_ = h
}

// The table against a map, under random puts, conditional puts and
// deletes of a few hundred keys: growth, deletes' backward shifts over
// keys of one home slot and of others, and the shrink of an emptied table.
func TestTableModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tb table
	model := map[Hash]Entry{}
	keys := make([]Hash, 300)
	for i := range keys {
		keys[i] = HashKey(strconv.Itoa(i))
	}
	// Keys whose home slots collide: their first 8 bytes agree, so their
	// slots match and only their entries tell them apart.
	for i := 1; i < 8; i++ {
		copy(keys[i][:8], keys[0][:8])
	}
	for step := range 200_000 {
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(4) {
		case 0, 1:
			e := Entry{Offset: int64(step), Stored: int64(step)}
			since := int64(step - rng.IntN(100))
			old, kept := tb.put(k, e, since)
			m, ok := model[k]
			if ok && m.Stored > since {
				require.True(t, kept, "step %d", step)
				require.Equal(t, m, old)
			} else {
				require.False(t, kept, "step %d", step)
				model[k] = e
			}
		case 2:
			var off int64
			if m, ok := model[k]; ok && rng.IntN(2) == 0 {
				off = m.Offset
			}
			tb.delete(k, off)
			if m, ok := model[k]; ok && m.Offset == off {
				delete(model, k)
			}
		case 3:
			e, ok := tb.get(k)
			m, mok := model[k]
			require.Equal(t, mok, ok, "step %d", step)
			require.Equal(t, m, e)
		}
		require.Equal(t, len(model), tb.len())
		if step%1000 == 0 { // every key findable where it is, no stray slot
			for k, m := range model {
				e, ok := tb.get(k)
				require.True(t, ok, "step %d", step)
				require.Equal(t, m, e)
			}
			n := 0
			for _, v := range tb.slots {
				if v != 0 {
					n++
				}
			}
			require.Equal(t, tb.len(), n, "step %d", step)
		}
		if step%50_000 == 0 { // empty it now and then
			for k, m := range model {
				tb.delete(k, m.Offset)
				delete(model, k)
			}
			require.Zero(t, tb.len())
			require.LessOrEqual(t, len(tb.slots), minSlots, "an emptied table gives its memory back")
		}
	}
	require.LessOrEqual(t, tb.len()*4, len(tb.slots)*3)
}

// Put adds a key or returns its fresh entry, as Lookup then Add.
func TestWindowPut(t *testing.T) {
	w := New(10)
	_, dup := w.Put(HashKey("a"), Entry{Offset: 0, Stored: 100}, 100)
	require.False(t, dup)
	e, dup := w.Put(HashKey("a"), Entry{Offset: 1, Stored: 105}, 105)
	require.True(t, dup)
	assert.Equal(t, int64(0), e.Offset)
	_, dup = w.Put(HashKey("a"), Entry{Offset: 2, Stored: 110}, 110)
	require.False(t, dup, "a window old: stored anew")
	e, ok := w.Lookup(HashKey("a"), 111)
	require.True(t, ok)
	assert.Equal(t, int64(2), e.Offset)
	w.Expire(115) // the item of offset 0 goes, not the entry of offset 2
	assert.Equal(t, 1, w.Len())
	w.Expire(120)
	assert.Zero(t, w.Len())
}
