package ferry

import (
	"slices"
	"time"
)

// QueueStats is a consumer's view of one queue it holds.
type QueueStats struct {
	// Queue is the queue.
	Queue QueueID
	// Buffer is the queue's [Buffer] now: messages and bytes buffered,
	// pending, in flight, peaks, whether fetching is paused by flow
	// control, the committable offset.
	Buffer BufferStats
	// Committed is the cursor last committed for the queue.
	Committed int64
	// Paused reports whether [Consumer.Pause] paused the queue.
	Paused bool
}

// ConsumerStats is a snapshot of a consumer, cheap enough to read often:
// counters are atomics, and each held queue's buffer is read under its
// own lock only.
type ConsumerStats struct {
	// Queues are the queues held now, sorted.
	Queues []QueueStats
	// InFlight counts the messages taken by handlers (or polled) and not
	// finished, over every queue held.
	InFlight int
	// Buffered counts the messages fetched and not finished, over every
	// queue held.
	Buffered int
	// Handled counts the handler calls that succeeded (for a
	// [PullConsumer], the messages committed), since Start.
	Handled uint64
	// Failed counts the handler calls that failed (an error or a panic).
	Failed uint64
	// Retried counts the retries scheduled after a failure.
	Retried uint64
	// DeadLettered counts the messages sent to the dead-letter topic.
	DeadLettered uint64
	// LastCommit is when a cursor was last committed; zero before the
	// first commit.
	LastCommit time.Time
}

// stats returns the member's part of a snapshot.
func (m *groupMember) stats() ConsumerStats {
	var st ConsumerStats
	m.mu.Lock()
	runs := make([]*queueRun, 0, len(m.runs))
	for _, r := range m.runs {
		if r.h.owned() {
			runs = append(runs, r)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(runs, func(a, b *queueRun) int { return a.q - b.q })
	for _, r := range runs {
		bs := r.buf.Stats()
		r.commitMu.Lock()
		committed := r.committed
		r.commitMu.Unlock()
		st.Queues = append(st.Queues, QueueStats{Queue: r.id, Buffer: bs, Committed: committed, Paused: r.h.held(holdPause)})
		st.InFlight += bs.InFlight
		st.Buffered += bs.Messages
	}
	if ns := m.lastCommit.Load(); ns != 0 {
		st.LastCommit = time.Unix(0, ns)
	}
	st.Handled = m.handled.Load()
	return st
}

// Stats returns a snapshot of the consumer: the queues it holds with
// their buffers, and counters since Start.
func (c *Consumer) Stats() ConsumerStats {
	st := c.m.stats()
	if d := c.deliverer(); d != nil {
		st.Handled += d.handled.Load()
		st.Failed = d.failed.Load()
		st.Retried = d.retried.Load()
		st.DeadLettered = d.deadLettered.Load()
	}
	c.retryMu.Lock()
	rc := c.retry
	c.retryMu.Unlock()
	if rc != nil { // its counts, not its queues (see Assigned)
		rs := rc.Stats()
		st.Handled += rs.Handled
		st.Failed += rs.Failed
		st.Retried += rs.Retried
		st.DeadLettered += rs.DeadLettered
	}
	return st
}

// Stats returns a snapshot of the consumer: the queues it holds with
// their buffers, and the messages committed since Start (Handled).
func (c *PullConsumer) Stats() ConsumerStats { return c.m.stats() }

// ProducerStats counts what a producer sent.
type ProducerStats struct {
	// Sent counts the messages written.
	Sent uint64
	// Failed counts the messages a Send or SendBatch failed to write
	// (refused, or their write failed).
	Failed uint64
}

// Stats returns the producer's counts since it was made.
func (p *Producer) Stats() ProducerStats {
	return ProducerStats{Sent: p.sent.Load(), Failed: p.failed.Load()}
}

// countBatch counts a SendBatch of n messages.
func (p *Producer) countBatch(results []SendResult, n int, err error) {
	if err == nil {
		p.sent.Add(uint64(n))
		return
	}
	var ok uint64
	for _, r := range results {
		if r.Offset >= 0 {
			ok++
		}
	}
	p.sent.Add(ok)
	p.failed.Add(uint64(n) - ok)
}

// BrokerStats is a snapshot of a broker.
type BrokerStats struct {
	// Topics and Queues count the topics the broker has open and their
	// queues.
	Topics, Queues int
	// Consumers counts the consumers open (started and not closed).
	Consumers int
}

// Stats returns a snapshot of the broker.
func (b *Broker) Stats() BrokerStats {
	var st BrokerStats
	b.each(func(t *topicState) {
		st.Topics++
		st.Queues += len(t.queues)
	})
	b.groups.mu.Lock()
	st.Consumers = len(b.groups.closers)
	b.groups.mu.Unlock()
	return st
}
