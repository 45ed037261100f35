package ferry_test

import (
	"bytes"
	"context"
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
	assert.NotEmpty(t, ferry.Hostname())
}

// Sends take their IDs from counter ranges their producer's envelope
// slabs reserve: across producers and concurrent Sends of each they stay
// unique, keep the process's tag in bytes 6-9, and grow along each
// goroutine's sends.
func TestSendIDsUniqueAcrossProducers(t *testing.T) {
	ctx := context.Background()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 4,
		Retention: ferry.Retention{MaxMessages: ferry.Unlimited, MaxBytes: ferry.Unlimited}}))
	const producers, senders, each = 3, 3, 500 // each well over one slab
	ids := make([][]ferry.MessageID, producers*senders)
	var wg sync.WaitGroup
	for i := range producers {
		p, err := b.NewProducer()
		require.NoError(t, err)
		for j := range senders {
			k := i*senders + j
			wg.Go(func() {
				for range each {
					res, err := p.Send(ctx, &ferry.Message{Topic: "t"})
					if err != nil {
						t.Error(err)
						return
					}
					ids[k] = append(ids[k], res.ID)
				}
			})
		}
	}
	wg.Wait()
	tag := ferry.NewMessageID(time.Now())
	seen := make(map[ferry.MessageID]bool)
	for _, run := range ids {
		require.Len(t, run, each)
		for n, id := range run {
			require.False(t, seen[id], "duplicate id %s", id)
			seen[id] = true
			require.Equal(t, tag[6:10], id[6:10], "process tag of %s", id)
			if n > 0 {
				require.Negative(t, bytes.Compare(run[n-1][:], id[:]), "%s after %s", id, run[n-1])
			}
		}
	}
}

func TestMessageIDLayout(t *testing.T) {
	at := time.UnixMilli(0x0102_0304_0506)
	id := ferry.NewMessageID(at)
	assert.Equal(t, []byte{1, 2, 3, 4, 5, 6}, id[:6], "Unix milliseconds, big endian")
	assert.Equal(t, at, id.Time())
	next := ferry.NewMessageID(at)
	assert.Equal(t, id[:10], next[:10])
	assert.Less(t, id.String(), next.String(), "the counter, big endian, in bytes 10-15")
}

func TestMessageSize(t *testing.T) {
	m := &ferry.Message{Key: "kk", Tag: "t", Headers: map[string]string{"a": "bc"}, Body: make([]byte, 10)}
	assert.Equal(t, 2+1+3+10, m.Size())
}
