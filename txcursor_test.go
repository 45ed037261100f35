package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// txStore is a TxCursorStore over the memory store: each transaction
// writes its effects into a staging map, applied with the finished
// offset only at Commit (a database transaction in miniature).
type txStore struct {
	*ferry.MemoryCursorStore
	mu        sync.Mutex
	effects   map[int64]int // offset -> effects applied
	begun     int
	maxToken  uint64
	committed int
	rolled    int
	// failCommit fails the Commit of an effect's first n attempts.
	failCommit map[int64]int
	// finished holds the offsets transactions finished, by topic (one
	// queue), for TakeCursor to fold in as the TxCursorStore contract says.
	finished map[string]map[int64]bool
}

func (s *txStore) TakeCursor(ctx context.Context, topic, group string, queue int, token uint64) (int64, []int64, error) {
	off, fin, err := s.MemoryCursorStore.TakeCursor(ctx, topic, group, queue, token)
	if err != nil {
		return off, fin, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	done := map[int64]bool{}
	for _, o := range fin {
		done[o] = true
	}
	for o := range s.finished[topic] {
		if o >= off {
			done[o] = true
		}
	}
	if off < 0 && len(done) > 0 {
		off = 0
	}
	for done[off] {
		delete(done, off)
		off++
	}
	fin = fin[:0]
	for o := range done {
		if o > off {
			fin = append(fin, o)
		}
	}
	slices.Sort(fin)
	if len(fin) == 0 {
		fin = nil
	}
	return off, fin, nil
}

type txKey struct{}

type fakeTx struct {
	s      *txStore
	topic  string
	offset int64
	staged []int64 // the origin offsets of the effects
	done   bool
}

func newTxStore() *txStore {
	return &txStore{MemoryCursorStore: ferry.NewMemoryCursorStore(), effects: map[int64]int{},
		failCommit: map[int64]int{}, finished: map[string]map[int64]bool{}}
}

func (s *txStore) Begin(ctx context.Context, topic, group string, queue int, offset int64, token uint64) (context.Context, ferry.CursorTx, error) {
	s.mu.Lock()
	s.begun++
	s.maxToken = max(s.maxToken, token)
	s.mu.Unlock()
	tx := &fakeTx{s: s, topic: topic, offset: offset}
	return context.WithValue(ctx, txKey{}, tx), tx, nil
}

func (tx *fakeTx) Commit(ctx context.Context) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.done {
		return errors.New("transaction done")
	}
	tx.done = true
	for _, o := range tx.staged {
		if s.failCommit[o] > 0 {
			s.failCommit[o]--
			return errors.New("commit refused")
		}
	}
	for _, o := range tx.staged {
		s.effects[o]++
	}
	if s.finished[tx.topic] == nil {
		s.finished[tx.topic] = map[int64]bool{}
	}
	s.finished[tx.topic][tx.offset] = true
	s.committed++
	return nil
}

func (tx *fakeTx) Rollback() error {
	tx.s.mu.Lock()
	defer tx.s.mu.Unlock()
	if tx.done {
		return errors.New("transaction done")
	}
	tx.done = true
	tx.s.rolled++
	return nil
}

// TestTxCursorStoreHandler: over a TxCursorStore, every handler call runs
// in a transaction of its own from the handler's context: a success
// commits it (the effect applied once), a failure rolls it back (the
// effect never applied) and is retried, and a Commit that fails counts as
// a failed attempt.
func TestTxCursorStoreHandler(t *testing.T) {
	for _, mode := range []string{"concurrent", "ordered", "keyed"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			s := newTxStore()
			s.failCommit[3] = 2 // offset 3's first two commits fail
			b, err := ferry.NewBroker(ferry.WithCursorStore(s))
			require.NoError(t, err)
			defer b.Close()
			require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
			const n = 20
			var mu sync.Mutex
			attempts := map[int64]int{}
			done := make(chan struct{}, 4*n)
			h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
				tx, ok := ctx.Value(txKey{}).(*fakeTx)
				if !ok || tx.topic != m.Topic && tx.topic != "%RETRY%g%%t" {
					return ferry.Permanent(fmt.Errorf("no transaction for offset %d in the handler's context", m.Offset))
				}
				if d, ok := ferry.DeliveryFrom(ctx); !ok || d.Group != "g" {
					return ferry.Permanent(errors.New("no delivery in the transaction's context"))
				}
				tx.staged = append(tx.staged, m.Offset)
				mu.Lock()
				attempts[m.Offset]++
				a := attempts[m.Offset]
				mu.Unlock()
				done <- struct{}{}
				if m.Offset%5 == 1 && a == 1 {
					return errors.New("first attempt fails")
				}
				return nil
			})
			opts := []ferry.ConsumerOption{ferry.WithRetry(5, time.Millisecond)}
			switch mode {
			case "ordered":
				opts = append(opts, ferry.Ordered())
			case "keyed":
				opts = append(opts, ferry.OrderedByKey(), ferry.WithConcurrency(4))
			}
			c, err := b.NewConsumer("g", "t", h, opts...)
			require.NoError(t, err)
			require.NoError(t, c.Start(ctx))
			defer c.Close()
			p, err := b.NewProducer()
			require.NoError(t, err)
			defer p.Close()
			for i := range n {
				_, err := p.Send(ctx, &ferry.Message{Topic: "t", Key: fmt.Sprint(i % 3), Body: []byte("m")})
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.committed >= n
			}, 10*time.Second, time.Millisecond)
			require.NoError(t, c.Close())
			s.mu.Lock()
			defer s.mu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			for off := range int64(n) {
				assert.Equal(t, 1, s.effects[off], "offset %d: effects applied", off)
				want := 1
				switch {
				case off == 3:
					want = 3 // two failed commits
				case off%5 == 1:
					want = 2 // one failed attempt
				}
				assert.Equal(t, want, attempts[off], "offset %d: attempts", off)
			}
			assert.Equal(t, n, s.committed)
			assert.Equal(t, s.begun, s.committed+s.rolled+2, "each transaction committed, rolled back or failed its commit, once")
		})
	}
}

// fencedTx is a txStore whose first Commit of offset 2 is refused as
// fenced: the lease moved on.
type fencedTx struct {
	*txStore
	once sync.Once
}

func (s *fencedTx) Begin(ctx context.Context, topic, group string, queue int, offset int64, token uint64) (context.Context, ferry.CursorTx, error) {
	ctx, tx, err := s.txStore.Begin(ctx, topic, group, queue, offset, token)
	if offset != 2 {
		return ctx, tx, err
	}
	fenced := false
	s.once.Do(func() { fenced = true })
	if !fenced {
		return ctx, tx, err
	}
	return ctx, fencedCommit{tx}, err
}

type fencedCommit struct{ ferry.CursorTx }

func (f fencedCommit) Commit(ctx context.Context) error {
	_ = f.Rollback()
	return fmt.Errorf("token stale: %w", ferry.ErrFenced)
}

// TestTxCursorStoreFenced: a transaction's Commit refused as fenced loses
// the queue (the member stops handling it under the stale lease); the
// queue is taken again and the message's effect lands once.
func TestTxCursorStoreFenced(t *testing.T) {
	ctx := context.Background()
	s := &fencedTx{txStore: newTxStore()}
	b, err := ferry.NewBroker(ferry.WithCursorStore(s))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		ctx.Value(txKey{}).(*fakeTx).staged = append(ctx.Value(txKey{}).(*fakeTx).staged, m.Offset)
		return nil
	})
	c, err := b.NewConsumer("g", "t", h, ferry.Ordered())
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for range 5 {
		_, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("m")})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.committed >= 5
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, c.Close())
	s.mu.Lock()
	defer s.mu.Unlock()
	for off := range int64(5) {
		assert.Equal(t, 1, s.effects[off], "offset %d: effects applied", off)
	}
	assert.Equal(t, 5, s.committed)
	assert.Greater(t, s.maxToken, uint64(1), "the queue was lost and taken again under a new lease")
}
