package ferry

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A level's message says its move in its tag, ahead of the message's
// own, and shares the message's headers; the delivery gets its tag back
// and its due time in HeaderDeliverAt.
func TestDelayTagRoundTrip(t *testing.T) {
	lv := &level{t: &topicState{meta: TopicMeta{Name: delayTopic(7)}}}
	h := map[string]string{"a": "1"}
	em := &EnhancedMessage{Message: Message{Topic: "jobs", Key: "k", Tag: "red|blue", Headers: h, Body: []byte("x"), DedupKey: "%retry:x"}}
	at, hop := time.Unix(0, 1_700_000_000_123_456_789), time.Unix(0, 1_700_000_000_000_000_001)
	w := delayedMessage(&EnhancedMessage{}, lv, em, QueueID{Topic: "jobs", Queue: 3}, at, hop, 42)
	assert.Equal(t, h, w.Headers)
	assert.Equal(t, "%retry:x", w.DedupKey)
	w.Offset = 5
	a, err := parseDelayed(w)
	require.NoError(t, err)
	assert.True(t, a.deliverAt.Equal(at))
	assert.True(t, a.hop.Equal(hop))
	assert.Equal(t, QueueID{Topic: "jobs", Queue: 3}, a.target)
	assert.Equal(t, uint64(42), a.inc)
	assert.Equal(t, "red|blue", a.tag)

	d := delivered(&topicState{meta: TopicMeta{Name: "jobs"}}, a.msg, a.tag, "key", a.deliverAt)
	assert.Equal(t, "red|blue", d.Tag)
	assert.Equal(t, map[string]string{"a": "1", HeaderDeliverAt: "1700000000123456789"}, d.Headers)
	assert.Equal(t, map[string]string{"a": "1"}, h, "the message's own headers are left as they were")

	for _, bad := range []string{"", "no bar", "1,2,3,4|", "x,2,3,4,jobs|", "1,2,-1,0,jobs|"} {
		_, err := parseDelayed(&EnhancedMessage{Message: Message{Tag: bad}})
		assert.ErrorIs(t, err, ErrInvalidMessage, "%q", bad)
	}
}

// A level's message stored by an earlier version (its move in headers)
// moves as before: read from its headers, which neither a move down nor
// the delivery keeps (but HeaderDeliverAt on the delivery).
func TestDelayOldHeadersAreRead(t *testing.T) {
	old := &EnhancedMessage{Message: Message{Topic: delayTopic(3), Tag: "t", Headers: map[string]string{
		"a": "1", HeaderDeliverAt: "2000", headerDelayHop: "1000", headerDelayQueue: "2",
		headerDelayTopic: "jobs", headerDelayIncarnation: "9"}}}
	a, err := parseDelayed(old)
	require.NoError(t, err)
	assert.Equal(t, int64(2000), a.deliverAt.UnixNano())
	assert.Equal(t, int64(1000), a.hop.UnixNano())
	assert.Equal(t, QueueID{Topic: "jobs", Queue: 2}, a.target)
	assert.Equal(t, uint64(9), a.inc)
	assert.Equal(t, "t", a.tag)

	lv := &level{t: &topicState{meta: TopicMeta{Name: delayTopic(1)}}}
	down := *old
	down.Tag = a.tag
	w := delayedMessage(&EnhancedMessage{}, lv, &down, a.target, a.deliverAt, a.hop, a.inc)
	assert.Equal(t, map[string]string{"a": "1"}, w.Headers)
	b, err := parseDelayed(w)
	require.NoError(t, err)
	assert.Equal(t, uint64(9), b.inc)
	assert.Equal(t, "t", b.tag)

	d := delivered(&topicState{meta: TopicMeta{Name: "jobs"}}, old, a.tag, "key", a.deliverAt)
	assert.Equal(t, map[string]string{"a": "1", HeaderDeliverAt: "2000"}, d.Headers)
}

// stoppedClock is a clock that stands still at its time.
type stoppedClock struct{ at time.Time }

func (c stoppedClock) Now() time.Time                        { return c.at }
func (c stoppedClock) AfterFunc(time.Duration, func()) Timer { return nil }

// A level's placement time is its guess, or its floor if that is later,
// and raises the floor; only a reading of the clock says a message is
// due: one due by the placement time (a stamp ahead of the clock) but not
// by the clock goes to level 0, not to its target now.
func TestPlaceTime(t *testing.T) {
	now := time.Unix(1_000, 0)
	d := &delayer{clock: stoppedClock{now}}
	lv := &level{floor: now.Add(time.Second)}
	got, err := lv.placeTime(d, now, now.Add(time.Hour))
	require.NoError(t, err)
	assert.True(t, got.Equal(now.Add(time.Second)), "a guess behind the floor: the floor")
	got, err = lv.placeTime(d, now.Add(2*time.Second), now.Add(time.Hour))
	require.NoError(t, err)
	assert.True(t, got.Equal(now.Add(2*time.Second)), "a guess ahead of the floor: the guess")
	assert.True(t, lv.floor.Equal(got), "the floor follows")

	at := now.Add(5 * time.Millisecond) // due by the floor, not by the clock
	got, err = lv.placeTime(d, now, at)
	require.NoError(t, err)
	n, _ := delayLevel(at.Sub(got))
	assert.Zero(t, n, "level 0, which acts at the due time")

	_, err = lv.placeTime(d, now.Add(-time.Second), now)
	assert.ErrorIs(t, err, errDueNow, "due by the clock")
}

func TestDecimalLen(t *testing.T) {
	for _, u := range []uint64{0, 1, 9, 10, 99, 100, 1_700_000_000_123_456_789, 9_999_999_999_999_999_999, 10_000_000_000_000_000_000, math.MaxUint64} {
		assert.Equal(t, len(strconv.FormatUint(u, 10)), decimalLen(u), "%d", u)
	}
}
