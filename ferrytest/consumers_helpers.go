package ferrytest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// Helpers of the consumer suite that other tests use too: Produce, Tally,
// StartConsumer, Owners.

// Produce sends n messages to topic with bodies "<prefix><i>", keyed by
// "k<i % keys>", in batches of 500.
func Produce(t testing.TB, b *ferry.Broker, topic, prefix string, n, keys int) {
	t.Helper()
	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	const batch = 500
	for lo := 0; lo < n; lo += batch {
		msgs := make([]*ferry.Message, 0, batch)
		for i := lo; i < min(n, lo+batch); i++ {
			msgs = append(msgs, &ferry.Message{Topic: topic, Key: "k" + strconv.Itoa(i%keys), Body: []byte(prefix + strconv.Itoa(i))})
		}
		_, err := p.SendBatch(context.Background(), msgs)
		must(t, err, "send batch")
	}
}

// Tally counts handled messages by body and signals when a number of
// distinct bodies has been seen.
type Tally struct {
	mu     sync.Mutex
	seen   map[string]int
	want   int
	all    chan struct{}
	closed bool
}

// NewTally returns a Tally that is complete once want distinct bodies
// were added.
func NewTally(want int) *Tally {
	return &Tally{seen: map[string]int{}, want: want, all: make(chan struct{})}
}

// Add counts one handling of body.
func (c *Tally) Add(body string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[body]++
	if !c.closed && len(c.seen) >= c.want {
		c.closed = true
		close(c.all)
	}
}

// Handler adds every message's body.
func (c *Tally) Handler() ferry.Handler {
	return ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		c.Add(string(m.Body))
		return nil
	})
}

// Duplicates is how many handlings repeated a body.
func (c *Tally) Duplicates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := 0
	for _, n := range c.seen {
		d += n - 1
	}
	return d
}

// Distinct is how many distinct bodies were added.
func (c *Tally) Distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// Count is how many times body was added.
func (c *Tally) Count(body string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[body]
}

// Bodies returns the distinct bodies added, sorted.
func (c *Tally) Bodies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.seen))
	for b := range c.seen {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// Done is closed once every wanted body was added.
func (c *Tally) Done() <-chan struct{} { return c.all }

// WaitAll waits for every wanted body, failing t after timeout (0: a
// minute).
func (c *Tally) WaitAll(t testing.TB, timeout time.Duration) {
	t.Helper()
	if timeout <= 0 {
		timeout = time.Minute
	}
	select {
	case <-c.all:
	case <-time.After(timeout):
		t.Fatalf("watchdog: %d of %d messages handled after %v", c.Distinct(), c.want, timeout)
	}
}

// waitAll waits for every wanted body within the subtest's watchdog.
func (e *env) waitAll(c *Tally) {
	e.t.Helper()
	select {
	case <-c.all:
	case <-e.w.ctx.Done():
		e.t.Fatalf("%d of %d messages handled", c.Distinct(), c.want)
	}
}

// waitFor waits for cond within the subtest's timeout.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	WaitFor(e.t, e.f.Timeout, what, cond, nil)
}

// StartConsumer makes and starts a consumer of group on topic "t" of b,
// closed when the test ends (a Close error fails it).
func StartConsumer(t testing.TB, b *ferry.Broker, group string, h ferry.Handler, opts ...ferry.ConsumerOption) *ferry.Consumer {
	t.Helper()
	c, err := b.NewConsumer(group, "t", h, opts...)
	must(t, err, "new consumer")
	must(t, c.Start(context.Background()), "start consumer")
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close consumer %s: %v", c.MemberID(), err)
		}
	})
	return c
}

// Owners returns every member's assignment and fails t on a queue held
// twice.
func Owners(t testing.TB, cs ...*ferry.Consumer) map[ferry.QueueID]string {
	t.Helper()
	owners := map[ferry.QueueID]string{}
	for _, c := range cs {
		for _, q := range c.Assigned() {
			if o, ok := owners[q]; ok {
				t.Errorf("queue %s held by %s and %s", q, o, c.MemberID())
			}
			owners[q] = c.MemberID()
		}
	}
	return owners
}

func check(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}
