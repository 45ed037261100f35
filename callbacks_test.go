package ferry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eventLog records callback and handler events in order.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
}

func (l *eventLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

func (l *eventLog) index(e string) int {
	for i, x := range l.snapshot() {
		if x == e {
			return i
		}
	}
	return -1
}

// OnAssigned runs when a queue is taken, before its messages; OnRevoked
// when it is given up, after the drain and before the next owner takes
// it; a panicking callback is reported, not a crash.
func TestRebalanceCallbacks(t *testing.T) {
	b := newTopic(t, 2)
	log := &eventLog{}
	block := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	member := func(id string) []ferry.ConsumerOption {
		return []ferry.ConsumerOption{
			ferry.WithMemberID(id),
			ferry.WithOnAssigned(func(q ferry.QueueID) { log.add("%s assigned %d", id, q.Queue) }),
			ferry.WithOnRevoked(func(q ferry.QueueID) { log.add("%s revoked %d", id, q.Queue) }),
		}
	}
	h := func(id string) ferry.Handler {
		return ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
			if id == "m2" && m.Queue == 0 {
				once.Do(func() { close(started) })
				<-block
				log.add("%s handled %d/%d", id, m.Queue, m.Offset)
			}
			return nil
		})
	}
	startConsumer(t, b, "g", h("m2"), member("m2")...)
	assert.Equal(t, []string{"m2 assigned 0", "m2 assigned 1"}, sorted(log.snapshot()))
	p, err := b.NewProducer(ferry.WithRouter(ferry.ManualRouter(0)))
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(context.Background(), &ferry.Message{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	waitFor(t, started, "m2 handles queue 0's message")
	m1, err := b.NewConsumer("g", "t", h("m1"), member("m1")...) // m1 sorts first: it takes queue 0
	require.NoError(t, err)
	defer m1.Close()
	joined := make(chan error, 1)
	go func() { joined <- m1.Start(context.Background()) }()
	close(block)
	require.NoError(t, <-joined)
	revoked := log.index("m2 revoked 0")
	require.GreaterOrEqual(t, revoked, 0, "events: %v", log.snapshot())
	handled := -1
	for i, e := range log.snapshot() {
		if len(e) > 10 && e[:12] == "m2 handled 0" {
			handled = i
		}
	}
	assert.Less(t, handled, revoked, "revoked after the drain: %v", log.snapshot())
	assert.Less(t, revoked, log.index("m1 assigned 0"), "revoked before the next owner takes it: %v", log.snapshot())
}

// A callback that panics is reported.
func TestRebalanceCallbackPanicIsReported(t *testing.T) {
	b := newTopic(t, 1)
	errs := make(chan error, 4)
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }),
		ferry.WithOnAssigned(func(ferry.QueueID) { panic("boom") }),
		ferry.WithOnError(func(err error) { errs <- err }))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Close()
	select {
	case err := <-errs:
		assert.Contains(t, err.Error(), "boom")
	case <-time.After(watchdog):
		t.Fatal("watchdog: no report")
	}
	assert.Len(t, c.Assigned(), 1, "the queue is taken all the same")
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
