package ferry

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A member starts no handling on a queue once its lease may have expired
// by its own clock (DeadlineLease), even before Lost is closed: a process
// paused past its TTL wakes with its timers not yet run. Here the
// "pause" is a handler blocked on the first message while the lease's
// deadline passes; once it returns, no handling starts under that lease
// (the rest of the batch goes back), and the member takes the queue again
// under a new lease.
func TestNoHandlingPastLeaseDeadline(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(map[bool]string{false: "concurrent", true: "ordered"}[ordered], func(t *testing.T) {
			noHandlingPastLeaseDeadline(t, ordered)
		})
	}
}

func noHandlingPastLeaseDeadline(t *testing.T, ordered bool) {
	const n = 200
	ctx := context.Background()
	coord := &deadlineCoordinator{MemoryCoordinator: NewMemoryCoordinator()}
	b, err := NewBroker(WithCoordinator(coord))
	require.NoError(t, err)
	defer b.Close()
	defer coord.Close()
	require.NoError(t, b.CreateTopic(ctx, TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	for i := range n {
		_, err := p.Send(ctx, &Message{Topic: "t", Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
	}

	blocked, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	var calls, stale atomic.Int64
	h := HandlerFunc(func(ctx context.Context, m *EnhancedMessage) error {
		if coord.expired.Load() && coord.grants.Load() == 1 {
			stale.Add(1) // under the first lease, after its deadline
		}
		if calls.Add(1) == 1 {
			close(blocked)
			<-release
		}
		if m.Offset == n-1 {
			close(done)
		}
		return nil
	})
	opts := []ConsumerOption{WithConcurrency(1)}
	if ordered {
		opts = append(opts, Ordered())
	}
	c, err := b.NewConsumer("g", "t", h, opts...)
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()
	<-blocked
	coord.expire() // the first lease's deadline passes while the handler runs
	close(release)
	<-done // handled to the end, under the second lease
	assert.Zero(t, stale.Load(), "handler calls started under a lease past its deadline")
	assert.Equal(t, int64(2), coord.grants.Load(), "the queue was taken again")
}

// deadlineCoordinator is a MemoryCoordinator whose leases have a
// deadline (DeadlineLease), an hour ahead until expire puts the first
// one's in the past; its Lost is never closed for it.
type deadlineCoordinator struct {
	*MemoryCoordinator
	grants  atomic.Int64
	expired atomic.Bool
	first   atomic.Pointer[deadlineLease]
}

func (c *deadlineCoordinator) Join(ctx context.Context, g GroupKey, member string) (Session, error) {
	s, err := c.MemoryCoordinator.Join(ctx, g, member)
	if err != nil {
		return nil, err
	}
	return &deadlineSession{Session: s, c: c}, nil
}

func (c *deadlineCoordinator) expire() {
	c.expired.Store(true)
	c.first.Load().deadline.Store(time.Now().Add(-time.Second).UnixNano())
}

type deadlineSession struct {
	Session
	c *deadlineCoordinator
}

func (s *deadlineSession) Lock(ctx context.Context, queue int) (Lease, error) {
	l, err := s.Session.Lock(ctx, queue)
	if err != nil {
		return nil, err
	}
	dl := &deadlineLease{Lease: l}
	dl.deadline.Store(time.Now().Add(time.Hour).UnixNano())
	if s.c.grants.Add(1) == 1 {
		s.c.first.Store(dl)
	}
	return dl, nil
}

type deadlineLease struct {
	Lease
	deadline atomic.Int64
}

func (l *deadlineLease) Deadline() (time.Time, bool) { return time.Unix(0, l.deadline.Load()), true }
