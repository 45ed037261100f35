package dedup

import (
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
	w.Add("a", Entry{Offset: 0, ID: [16]byte{1}, Stored: 100})
	w.Add("b", Entry{Offset: 1, Stored: 105})
	e, ok := w.Lookup("a", 109)
	require.True(t, ok)
	assert.Equal(t, Entry{Offset: 0, ID: [16]byte{1}, Stored: 100}, e)
	_, ok = w.Lookup("a", 110)
	assert.False(t, ok, "a window old: not a duplicate any more")
	_, ok = w.Lookup("c", 100)
	assert.False(t, ok)

	w.Expire(110)
	assert.Equal(t, 1, w.Len(), "a went, b stays")
	// a again, stored anew; the expiry of nothing older removes it.
	w.Add("a", Entry{Offset: 2, Stored: 111})
	w.Expire(115)
	assert.Equal(t, 1, w.Len())
	e, ok = w.Lookup("a", 115)
	require.True(t, ok)
	assert.Equal(t, int64(2), e.Offset)
	w.Expire(1000)
	assert.Equal(t, 0, w.Len())
}

// An entry re-added after its first expired survives the expiry of the
// first one's list item.
func TestWindowReAddedKeySurvivesOldItem(t *testing.T) {
	w := New(10)
	w.Add("a", Entry{Offset: 0, Stored: 0})
	_, ok := w.Lookup("a", 10)
	require.False(t, ok)
	w.Add("a", Entry{Offset: 5, Stored: 10})
	w.Expire(12) // drops the item of offset 0, not the map entry of offset 5
	e, ok := w.Lookup("a", 12)
	require.True(t, ok)
	assert.Equal(t, int64(5), e.Offset)
}

func TestWindowRollback(t *testing.T) {
	w := New(time.Hour)
	w.Add("a", Entry{Offset: 0})
	m := w.Mark()
	w.Add("b", Entry{Offset: 1})
	w.Add("c", Entry{Offset: 2})
	w.Rollback(m)
	assert.Equal(t, 1, w.Len())
	_, ok := w.Lookup("b", 0)
	assert.False(t, ok)
	_, ok = w.Lookup("a", 0)
	assert.True(t, ok)
	w.Add("b", Entry{Offset: 1})
	assert.Equal(t, 2, w.Len())
}

// Memory stays bounded by what the window holds: a long run of keys
// through a short window keeps only the recent ones.
func TestWindowBounded(t *testing.T) {
	w := New(100)
	for i := range 100_000 {
		now := int64(i)
		w.Expire(now)
		w.Add(strconv.Itoa(i), Entry{Offset: int64(i), Stored: now})
		require.LessOrEqual(t, w.Len(), 100)
	}
	assert.LessOrEqual(t, len(w.fifo)-w.head, 100)
	assert.LessOrEqual(t, cap(w.fifo), 4096, "the list is compacted")
}
