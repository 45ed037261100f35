package ferry_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateTopicName(t *testing.T) {
	valid := []string{"a", "orders", "Orders.v2", "%DLQ%group", "a-b_c.d", strings.Repeat("x", 249), "..."}
	for _, name := range valid {
		assert.NoError(t, ferry.ValidateTopicName(name), name)
	}
	invalid := []string{"", ".", "..", "a/b", "../etc", "a\x00b", "a b", "ü", `a\b`, strings.Repeat("x", 250)}
	for _, name := range invalid {
		assert.ErrorIs(t, ferry.ValidateTopicName(name), ferry.ErrInvalidTopic, "%q", name)
	}
}

func TestTopicMetaValidate(t *testing.T) {
	assert.NoError(t, ferry.TopicMeta{Name: "t", Queues: 1}.Validate())
	bad := []ferry.TopicMeta{
		{Name: "", Queues: 1},
		{Name: "t", Queues: 0},
		{Name: "t", Queues: -1},
		{Name: "t", Queues: ferry.MaxQueues + 1},
		{Name: "t", Queues: 1, Retention: ferry.Retention{MaxMessages: -2}},
		{Name: "t", Queues: 1, Retention: ferry.Retention{MaxBytes: -5}},
		{Name: "t", Queues: 1, Retention: ferry.Retention{Overflow: 7}},
	}
	for _, m := range bad {
		assert.ErrorIs(t, m.Validate(), ferry.ErrInvalidTopic, "%+v", m)
	}
	n := ferry.TopicMeta{Name: "t", Queues: 2}.Normalized()
	assert.Equal(t, int64(ferry.DefaultRetentionMessages), n.Retention.MaxMessages)
	assert.Equal(t, int64(ferry.DefaultRetentionBytes), n.Retention.MaxBytes)
	assert.Equal(t, n, n.Normalized())
}

func TestQueueIDOrder(t *testing.T) {
	ids := []ferry.QueueID{{"b", 0}, {"a", 10}, {"a", 2}, {"c", 1}}
	slices.SortFunc(ids, ferry.QueueID.Compare)
	assert.Equal(t, []ferry.QueueID{{"a", 2}, {"a", 10}, {"b", 0}, {"c", 1}}, ids)
	assert.Equal(t, "a[2]", ids[0].String())
}

func TestMessageIDUniqueAndSortable(t *testing.T) {
	const goroutines, each = 8, 2000
	var mu sync.Mutex
	seen := make(map[ferry.MessageID]bool, goroutines*each)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			local := make([]ferry.MessageID, 0, each)
			for range each {
				local = append(local, ferry.NewMessageID(time.Now()))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range local {
				require.False(t, seen[id], "duplicate id %s", id)
				seen[id] = true
			}
		})
	}
	wg.Wait()
	assert.Len(t, seen, goroutines*each)

	early := ferry.NewMessageID(time.UnixMilli(1_000_000))
	late := ferry.NewMessageID(time.UnixMilli(2_000_000))
	assert.Less(t, early.String(), late.String(), "ids sort by time")
	assert.Equal(t, time.UnixMilli(1_000_000), early.Time())

	text, err := late.MarshalText()
	require.NoError(t, err)
	var back ferry.MessageID
	require.NoError(t, back.UnmarshalText(text))
	assert.Equal(t, late, back)
	assert.ErrorIs(t, back.UnmarshalText([]byte("short")), ferry.ErrInvalidMessage)
	assert.ErrorIs(t, back.UnmarshalText([]byte(strings.Repeat("z", 32))), ferry.ErrInvalidMessage)
	assert.True(t, ferry.MessageID{}.IsZero())
	assert.NotEmpty(t, ferry.BornAddress())
}

func TestMessageSize(t *testing.T) {
	m := &ferry.Message{Key: "kk", Tag: "t", Headers: map[string]string{"a": "bc"}, Body: make([]byte, 10)}
	assert.Equal(t, 2+1+3+10, m.Size())
}
