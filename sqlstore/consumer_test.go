package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/sqlstore"
)

// TestConsumer: a consumer over a Store runs each handler call in a
// transaction: every message's effect row lands once, a failed attempt's
// is rolled back, and the cursors end at the end of every queue.
func TestConsumer(t *testing.T) {
	for _, mode := range []string{"keyed", "concurrent"} {
		t.Run(mode, func(t *testing.T) { testConsumer(t, mode) })
	}
}

// testConsumer is TestConsumer in a mode: keyed (OrderedByKey, retries in
// place) or concurrent (retries off the queue, through the retry topic,
// whose messages are handled in transactions too).
func testConsumer(t *testing.T, mode string) {
	onEachDB(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b, err := ferry.NewBroker(ferry.WithCursorStore(e.s))
		require.NoError(t, err)
		defer b.Close()
		const queues, n = 3, 120
		require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: queues}))
		insert := e.q("INSERT INTO " + e.effects + " (id, n) VALUES (?, ?)")
		var mu sync.Mutex
		attempts := map[string]int{}
		h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
			tx, ok := sqlstore.TxFrom(ctx)
			if !ok {
				return ferry.Permanent(errors.New("no transaction"))
			}
			if _, err := tx.ExecContext(ctx, insert, string(m.Body), 0); err != nil {
				return err
			}
			mu.Lock()
			attempts[string(m.Body)]++
			a := attempts[string(m.Body)]
			mu.Unlock()
			if len(m.Body)%3 == 0 && a == 1 {
				return errors.New("first attempt fails") // rolled back: the row goes with it
			}
			return nil
		})
		opts := []ferry.ConsumerOption{ferry.WithConcurrency(4), ferry.WithRetry(10, time.Millisecond)}
		if mode == "keyed" {
			opts = append(opts, ferry.OrderedByKey())
		}
		c, err := b.NewConsumer("billing", "orders", h, opts...)
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		defer c.Close()
		p, err := b.NewProducer()
		require.NoError(t, err)
		defer p.Close()
		ends := make([]int64, queues)
		for i := range n {
			r, err := p.Send(ctx, &ferry.Message{Topic: "orders", Key: fmt.Sprint(i % 10), Body: fmt.Appendf(nil, "m%d", i)})
			require.NoError(t, err)
			ends[r.Queue.Queue] = r.Offset + 1
		}
		require.Eventually(t, func() bool { return e.count(t) >= n }, 60*time.Second, 5*time.Millisecond)
		require.NoError(t, c.Close())
		assert.Equal(t, n, e.count(t), "each effect once")
		var distinct int
		require.NoError(t, e.db.QueryRow("SELECT COUNT(DISTINCT id) FROM "+e.effects).Scan(&distinct))
		assert.Equal(t, n, distinct)
		offs, err := e.s.Load(ctx, "orders", "billing", queues)
		require.NoError(t, err)
		assert.Equal(t, ends, offs)
	})
}
