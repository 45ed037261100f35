package ferrytest_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldCommits is a memory cursor store whose fenced commits by one token
// wait, once armed, until released: a commit of the old owner still in
// flight (a slow network) when its lease is lost.
type heldCommits struct {
	*ferry.MemoryCursorStore
	token    atomic.Uint64 // the token whose commits wait; 0: none
	held     chan struct{} // closed when the first one waits
	release  chan struct{}
	once     sync.Once
	mu       sync.Mutex
	refused  []error // what the held commits returned
	returned chan struct{}
}

func (s *heldCommits) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if t := s.token.Load(); t != 0 && token == t {
		s.once.Do(func() { close(s.held) })
		<-s.release
		err := s.MemoryCursorStore.CommitFenced(ctx, topic, group, queue, offset, token)
		s.mu.Lock()
		s.refused = append(s.refused, err)
		s.mu.Unlock()
		select {
		case s.returned <- struct{}{}:
		default:
		}
		return err
	}
	return s.MemoryCursorStore.CommitFenced(ctx, topic, group, queue, offset, token)
}

// A broker whose member lost its lease (its session expired) while a
// commit was in flight hands the queue over, and that late commit is
// fenced: it cannot move the cursor back under the next owner.
func TestLateCommitOfExpiredMemberIsFenced(t *testing.T) {
	ctx := context.Background()
	storage := ferry.NewMemoryStorage()
	cursors := &heldCommits{MemoryCursorStore: ferry.NewMemoryCursorStore(), held: make(chan struct{}), release: make(chan struct{}), returned: make(chan struct{}, 1)}
	coord := ferrytest.NewFakeCoordinator()
	defer storage.Close()
	defer cursors.Close()
	defer coord.Close()
	g := ferry.GroupKey{Scope: "g", Topic: "t"}
	newBroker := func() *ferry.Broker {
		b, err := ferry.NewBroker(ferry.WithStorage(storage), ferry.WithCursorStore(cursors), ferry.WithCoordinator(coord))
		require.NoError(t, err)
		require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
		return b
	}
	b1, b2 := newBroker(), newBroker()
	defer b2.Close()

	var mu sync.Mutex
	seen := map[string]int{}
	h := ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		mu.Lock()
		seen[string(m.Body)]++
		mu.Unlock()
		return nil
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }
	c1, err := b1.NewConsumer("g", "t", h, ferry.WithMemberID("m1"))
	require.NoError(t, err)
	require.NoError(t, c1.Start(ctx))
	_, token, ok := coord.Holder(g, 0)
	require.True(t, ok)

	p, err := b2.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	send := func(from, n int) {
		for i := from; i < from+n; i++ {
			_, err := p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
			require.NoError(t, err)
		}
	}
	cursors.token.Store(token) // m1's commits wait from now on
	send(0, 10)
	select {
	case <-cursors.held:
	case <-time.After(20 * time.Second):
		t.Fatal("watchdog: m1 commits")
	}
	// m1 goes silent: its session expires with its commit in flight.
	coord.FailJoins(g, "m1", ferry.ErrClosed)
	require.True(t, coord.Expire(g, "m1"))
	c2, err := b2.NewConsumer("g", "t", h, ferry.WithMemberID("m2"))
	require.NoError(t, err)
	require.NoError(t, c2.Start(ctx))
	defer c2.Close()
	send(10, 10)
	require.Eventually(t, func() bool { return count() == 20 }, 20*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		offs, err := cursors.Load(ctx, "t", "g", 1)
		return err == nil && offs[0] == 20
	}, 20*time.Second, time.Millisecond, "m2 commits")

	close(cursors.release) // m1's late commit lands now
	select {
	case <-cursors.returned:
	case <-time.After(20 * time.Second):
		t.Fatal("watchdog: the late commit returns")
	}
	cursors.mu.Lock()
	require.NotEmpty(t, cursors.refused)
	assert.ErrorIs(t, cursors.refused[0], ferry.ErrFenced, "the old owner's late commit is refused")
	cursors.mu.Unlock()
	offs, err := cursors.Load(ctx, "t", "g", 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{20}, offs, "the cursor did not move back")
	coord.FailJoins(g, "m1", nil)
	require.NoError(t, b1.Close())
}
