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
	assert.Equal(t, 1, w.Len(), "a went, b stays")
	// a again, stored anew; the expiry of nothing older removes it.
	w.Add(HashKey("a"), Entry{Offset: 2, Stored: 111})
	w.Expire(115)
	assert.Equal(t, 1, w.Len())
	e, ok = w.Lookup(HashKey("a"), 115)
	require.True(t, ok)
	assert.Equal(t, int64(2), e.Offset)
	w.Expire(1000)
	assert.Equal(t, 0, w.Len())
}

// An entry re-added after its first expired survives the expiry of the
// first one's list item.
func TestWindowReAddedKeySurvivesOldItem(t *testing.T) {
	w := New(10)
	w.Add(HashKey("a"), Entry{Offset: 0, Stored: 0})
	_, ok := w.Lookup(HashKey("a"), 10)
	require.False(t, ok)
	w.Add(HashKey("a"), Entry{Offset: 5, Stored: 10})
	w.Expire(12) // drops the item of offset 0, not the map entry of offset 5
	e, ok := w.Lookup(HashKey("a"), 12)
	require.True(t, ok)
	assert.Equal(t, int64(5), e.Offset)
}

// Rollback and Expire across chunks.
func TestWindowChunks(t *testing.T) {
	w := New(1000)
	for i := range 3 * chunkLen {
		w.Add(HashKey(strconv.Itoa(i)), Entry{Offset: int64(i), Stored: int64(i)})
	}
	m := w.Mark()
	for i := 3 * chunkLen; i < 5*chunkLen+7; i++ {
		w.Add(HashKey(strconv.Itoa(i)), Entry{Offset: int64(i), Stored: int64(i)})
	}
	w.Rollback(m)
	assert.Equal(t, 3*chunkLen, w.Len())
	assert.Len(t, w.fifo, 3)
	_, ok := w.Lookup(HashKey(strconv.Itoa(3*chunkLen)), 0)
	assert.False(t, ok)
	w.Expire(1000 + chunkLen + 3) // drops offsets 0 .. chunkLen+3
	assert.Equal(t, 2*chunkLen-4, w.Len())
	_, ok = w.Lookup(HashKey(strconv.Itoa(chunkLen+4)), 1000+chunkLen+3)
	assert.True(t, ok)
	w.Rollback(w.Mark() - (2*chunkLen - 4)) // everything left
	assert.Zero(t, w.Len())
	assert.Empty(t, w.fifo)
	w.Add(HashKey("x"), Entry{})
	assert.Equal(t, 1, w.Len())
}

func TestWindowRollback(t *testing.T) {
	w := New(time.Hour)
	w.Add(HashKey("a"), Entry{Offset: 0})
	m := w.Mark()
	w.Add(HashKey("b"), Entry{Offset: 1})
	w.Add(HashKey("c"), Entry{Offset: 2})
	w.Rollback(m)
	assert.Equal(t, 1, w.Len())
	_, ok := w.Lookup(HashKey("b"), 0)
	assert.False(t, ok)
	_, ok = w.Lookup(HashKey("a"), 0)
	assert.True(t, ok)
	w.Add(HashKey("b"), Entry{Offset: 1})
	assert.Equal(t, 2, w.Len())
}

// Memory stays bounded by what the window holds: a long run of keys
// through a short window keeps only the recent ones.
func TestWindowBounded(t *testing.T) {
	w := New(100)
	for i := range 100_000 {
		now := int64(i)
		w.Expire(now)
		w.Add(HashKey(strconv.Itoa(i)), Entry{Offset: int64(i), Stored: now})
		require.LessOrEqual(t, w.Len(), 100)
	}
	assert.LessOrEqual(t, w.n, 100)
	assert.LessOrEqual(t, len(w.fifo), 2, "the list keeps the chunks it needs")
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

// BenchmarkWindow is a write's work per new key: hash, expire, look up,
// add, with every key kept (a window longer than the run).
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
		h := HashKey(keys[i])
		if _, ok := w.Lookup(h, now); ok {
			b.Fatal("duplicate")
		}
		w.Add(h, Entry{Offset: int64(i), Stored: now})
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
		h := HashKey(keys[i])
		if _, ok := w.Lookup(h, now); ok {
			b.Fatal("duplicate")
		}
		w.Add(h, Entry{Offset: int64(i), Stored: now})
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
	// Keys whose home slots collide: their low 8 bytes agree.
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
			for _, c := range tb.ctrl {
				if c != empty {
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
