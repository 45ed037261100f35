package ferrytest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ferrymq/ferry"
)

// The consumer suite's cases.

func (s *consumerSuite) exactlyOnce(e *env) {
	t := e.t
	n := e.f.scale(12000, 300)
	if testing.Short() {
		n = e.f.scale(3000, 300)
	}
	b := e.newTopic(8)
	c := NewTally(n)
	var cs []*ferry.Consumer
	watch := &stableWatch{t: t}
	for i := range 3 {
		id := "m" + strconv.Itoa(i)
		cs = append(cs, StartConsumer(t, b, "g", c.Handler(), append(watch.opts(id), ferry.WithMemberID(id))...))
	}
	// AllocateAveragely over m0, m1, m2: {0,1,2}, {3,4,5}, {6,7}.
	want := [][]ferry.QueueID{{{Topic: "t", Queue: 0}, {Topic: "t", Queue: 1}, {Topic: "t", Queue: 2}}, {{Topic: "t", Queue: 3}, {Topic: "t", Queue: 4}, {Topic: "t", Queue: 5}}, {{Topic: "t", Queue: 6}, {Topic: "t", Queue: 7}}}
	e.waitFor("the averaged split", func() bool {
		Owners(t, cs...) // never a queue held twice, even mid-rebalance
		for i, c := range cs {
			if !slices.Equal(want[i], c.Assigned()) {
				return false
			}
		}
		return true
	})
	watch.stable.Store(true)

	Produce(t, b, "t", "m", n, 1000)
	e.waitAll(c)
	// Every commit is in before the group stops being stable.
	e.waitFor("every message committed", func() bool {
		offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 8)
		must(t, err, "load cursors")
		sum := int64(0)
		for _, o := range offs {
			sum += max(o, 0)
		}
		return sum == int64(n)
	})
	watch.stable.Store(false)
	for _, cn := range cs {
		must(t, cn.Close(), "close")
	}
	check(t, c.Distinct() == n, "%d distinct messages handled, want %d", c.Distinct(), n)
	check(t, c.Duplicates() == 0, "a stable group handles each message once: %d duplicates", c.Duplicates())
}

func (s *consumerSuite) resume(e *env) {
	t := e.t
	b := e.newTopic(2)
	Produce(t, b, "t", "a", 100, 10)
	first := NewTally(100)
	c1 := StartConsumer(t, b, "g", first.Handler())
	e.waitAll(first)
	must(t, c1.Close(), "close")
	wantErr(t, c1.Start(context.Background()), ferry.ErrClosed, "Start after Close")
	must(t, c1.Close(), "Close again (idempotent)")

	Produce(t, b, "t", "b", 50, 10)
	second := NewTally(50)
	StartConsumer(t, b, "g", second.Handler())
	e.waitAll(second)
	for _, body := range second.Bodies() {
		check(t, body[0] == 'b', "a resumed group sees only new messages, got %q", body)
	}
}

func (s *consumerSuite) startFrom(e *env) {
	t := e.t
	b := e.newTopic(1)
	Produce(t, b, "t", "old", 10, 1)

	latest := NewTally(5)
	StartConsumer(t, b, "late", latest.Handler(), ferry.WithStartFrom(ferry.Latest))
	earliest := NewTally(15)
	StartConsumer(t, b, "early", earliest.Handler()) // Earliest is the default
	Produce(t, b, "t", "new", 5, 1)
	e.waitAll(latest)
	e.waitAll(earliest)
	for _, body := range latest.Bodies() {
		check(t, strings.Contains(body, "new"), "Latest handled %q", body)
	}
	check(t, earliest.Distinct() == 15, "Earliest handled %d, want 15", earliest.Distinct())
}

func (s *consumerSuite) ordered(e *env) {
	t := e.t
	keys, perKey := 40, e.f.scale(100, 10)
	b := e.newTopic(4)
	var mu sync.Mutex
	last := map[string]int{}
	var bad []string
	c := NewTally(keys * perKey)
	h := ferry.HandlerFunc(func(_ context.Context, m *ferry.EnhancedMessage) error {
		seq, _ := strconv.Atoi(string(m.Body[strings.IndexByte(string(m.Body), '/')+1:]))
		mu.Lock()
		if prev, ok := last[m.Key]; ok && seq != prev+1 {
			bad = append(bad, m.Key+": "+strconv.Itoa(prev)+" then "+strconv.Itoa(seq))
		}
		last[m.Key] = seq
		mu.Unlock()
		c.Add(string(m.Body))
		return nil
	})
	StartConsumer(t, b, "g", h, ferry.Ordered(), ferry.WithConcurrency(8), ferry.WithMemberID("a"))
	StartConsumer(t, b, "g", h, ferry.Ordered(), ferry.WithConcurrency(8), ferry.WithMemberID("b"))
	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	for i := range perKey {
		msgs := make([]*ferry.Message, keys)
		for k := range keys {
			key := "key" + strconv.Itoa(k)
			msgs[k] = &ferry.Message{Topic: "t", Key: key, Body: []byte(key + "/" + strconv.Itoa(i))}
		}
		_, err := p.SendBatch(context.Background(), msgs)
		must(t, err, "send batch")
	}
	e.waitAll(c)
	mu.Lock()
	defer mu.Unlock()
	check(t, len(bad) == 0, "out of order: %v", bad)
	for k := range keys {
		key := "key" + strconv.Itoa(k)
		check(t, last[key] == perKey-1, "%s: last handled %d, want %d", key, last[key], perKey-1)
	}
}

func (s *consumerSuite) broadcast(e *env) {
	t := e.t
	n := e.f.scale(1000, 200)
	b := e.newTopic(4)
	var tallies []*Tally
	for i := range 3 {
		c := NewTally(n)
		tallies = append(tallies, c)
		cn := StartConsumer(t, b, "fanout", c.Handler(), ferry.Broadcast(), ferry.WithMemberID("m"+strconv.Itoa(i)))
		check(t, len(cn.Assigned()) == 4, "a broadcast member holds every queue: %v", cn.Assigned())
	}
	Produce(t, b, "t", "x", n, 50)
	for _, c := range tallies {
		e.waitAll(c)
		check(t, c.Duplicates() == 0, "%d duplicates", c.Duplicates())
	}
}

func (s *consumerSuite) broadcastCursors(e *env) {
	t := e.t
	cursors := e.be.Cursors
	b := e.newTopic(1)
	Produce(t, b, "t", "x", 20, 1)
	c := NewTally(20)
	cn := StartConsumer(t, b, "fanout", c.Handler(), ferry.Broadcast(), ferry.WithMemberID("m1"))
	e.waitAll(c)
	must(t, cn.Close(), "close")
	offs, err := cursors.Load(e.w.ctx, "t", "fanout@m1", 1)
	must(t, err, "load fanout@m1")
	check(t, slices.Equal(offs, []int64{20}), "a broadcast member's cursor is kept under <group>@<member>: %v, want [20]", offs)
	offs, err = cursors.Load(e.w.ctx, "t", "fanout", 1)
	must(t, err, "load fanout")
	check(t, slices.Equal(offs, []int64{-1}), "the group's own cursor: %v, want [-1]", offs)

	// The same member ID resumes where it stopped; a new one starts over.
	Produce(t, b, "t", "y", 5, 1)
	again := NewTally(5)
	StartConsumer(t, b, "fanout", again.Handler(), ferry.Broadcast(), ferry.WithMemberID("m1"))
	fresh := NewTally(25)
	StartConsumer(t, b, "fanout", fresh.Handler(), ferry.Broadcast(), ferry.WithMemberID("m2"))
	e.waitAll(again)
	e.waitAll(fresh)
	for _, body := range again.Bodies() {
		check(t, body[0] == 'y', "m1 resumed with %q", body)
	}
}

func (s *consumerSuite) tags(e *env) {
	t := e.t
	b := e.newTopic(1)
	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	for i := range 30 {
		tag := []string{"red", "green", "blue"}[i%3]
		_, err := p.Send(context.Background(), &ferry.Message{Topic: "t", Tag: tag, Body: []byte(tag + strconv.Itoa(i))})
		must(t, err, "send")
	}
	c := NewTally(20)
	cn := StartConsumer(t, b, "g", c.Handler(), ferry.WithTags("red", "blue"))
	e.waitAll(c)
	must(t, cn.Close(), "close")
	for _, body := range c.Bodies() {
		check(t, !strings.HasPrefix(body, "green"), "filtered out, but handled: %s", body)
	}
	offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 1)
	must(t, err, "load")
	check(t, slices.Equal(offs, []int64{30}), "the filtered messages are committed too: %v, want [30]", offs)
}

func (s *consumerSuite) pullPollCommit(e *env) {
	t := e.t
	b := e.newTopic(2)
	Produce(t, b, "t", "x", 40, 8)

	pc, err := b.NewPullConsumer("g", "t")
	must(t, err, "new pull consumer")
	_, err = pc.Poll(e.w.ctx, 0)
	wantErr(t, err, ferry.ErrInvalidOption, "Poll(0)")

	seen := map[string]bool{}
	var kept []*ferry.EnhancedMessage
	for len(seen) < 40 {
		msgs, err := pc.Poll(e.w.ctx, 7)
		must(t, err, "poll")
		if len(msgs) == 0 || len(msgs) > 7 {
			t.Fatalf("Poll(7) returned %d messages", len(msgs))
		}
		for _, m := range msgs {
			if seen[string(m.Body)] {
				t.Fatalf("polled twice: %s", m.Body)
			}
			seen[string(m.Body)] = true
			if m.Queue == 0 && m.Offset == 3 {
				kept = append(kept, m) // never committed
				continue
			}
			must(t, pc.Commit(e.w.ctx, m), "commit")
		}
	}
	check(t, slices.Equal(pc.Assigned(), []ferry.QueueID{{Topic: "t", Queue: 0}, {Topic: "t", Queue: 1}}), "assigned %v", pc.Assigned())
	must(t, pc.Close(), "close")
	must(t, pc.Close(), "close again")
	_, err = pc.Poll(e.w.ctx, 1)
	wantErr(t, err, ferry.ErrClosed, "Poll after Close")
	wantErr(t, pc.Commit(e.w.ctx, kept...), ferry.ErrClosed, "Commit after Close")

	offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 2)
	must(t, err, "load")
	check(t, offs[0] == 3, "the uncommitted message holds its queue's cursor: %v", offs)

	// The next member of the group gets queue 0 again from offset 3.
	again, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	defer again.Close()
	msgs, err := again.Poll(e.w.ctx, 100)
	must(t, err, "poll")
	if len(msgs) == 0 {
		t.Fatal("Poll returned nothing")
	}
	check(t, msgs[0].Queue == 0 && msgs[0].Offset == 3, "first polled %d@%d, want 0@3", msgs[0].Queue, msgs[0].Offset)
}

func (s *consumerSuite) pullMessages(e *env) {
	t := e.t
	b := e.newTopic(1)
	Produce(t, b, "t", "x", 10, 1)
	pc, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	var got []string
	for m, err := range pc.Messages(e.w.ctx) {
		must(t, err, "messages")
		got = append(got, string(m.Body))
		if len(got) == 6 {
			break
		}
	}
	check(t, slices.Equal(got, []string{"x0", "x1", "x2", "x3", "x4", "x5"}), "got %v", got)
	must(t, pc.Close(), "close")
	offs, err := e.be.Cursors.Load(e.w.ctx, "t", "g", 1)
	must(t, err, "load")
	check(t, slices.Equal(offs, []int64{6}), "cursor %v, want [6]", offs)

	// A cancelled context ends the iteration with its error.
	ctx, cancel := context.WithCancel(e.w.ctx)
	defer cancel()
	pc2, err := b.NewPullConsumer("g", "t", ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	defer pc2.Close()
	n := 0
	for m, err := range pc2.Messages(ctx) {
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Messages ended with %v, want context.Canceled", err)
			}
			break
		}
		check(t, string(m.Body) == "x"+strconv.Itoa(6+n), "got %s, want x%d", m.Body, 6+n)
		n++
		if n == 4 {
			cancel()
		}
	}
	check(t, n == 4, "%d messages before the cancel, want 4", n)
}

func (s *consumerSuite) pullAndPush(e *env) {
	t := e.t
	n := e.f.scale(2000, 200)
	b := e.newTopic(4)
	c := NewTally(n)
	push := StartConsumer(t, b, "g", c.Handler(), ferry.WithMemberID("a-push"))
	pc, err := b.NewPullConsumer("g", "t", ferry.WithMemberID("b-pull"), ferry.WithAutoCommit())
	must(t, err, "new pull consumer")
	must(t, pc.Start(e.w.ctx), "start")
	defer pc.Close()
	e.waitFor("two queues each", func() bool { return len(push.Assigned()) == 2 && len(pc.Assigned()) == 2 })
	check(t, slices.Equal(pc.Assigned(), []ferry.QueueID{{Topic: "t", Queue: 2}, {Topic: "t", Queue: 3}}), "pull member holds %v", pc.Assigned())

	Produce(t, b, "t", "x", n, 100)
	ctx, cancel := context.WithCancel(e.w.ctx)
	defer cancel()
	pulled := make(chan struct{})
	go func() {
		defer close(pulled)
		for m, err := range pc.Messages(ctx) {
			if err != nil {
				return
			}
			c.Add(string(m.Body))
		}
	}()
	e.waitAll(c)
	cancel()
	<-pulled
	check(t, c.Duplicates() == 0, "%d duplicates", c.Duplicates())
}

// churn: members join and leave the group while messages are produced:
// each churn step follows a produced batch, so membership changes every
// few milliseconds. Nothing may be lost. Duplicates can only come from
// messages in flight when a member gave a queue up without finishing them
// (the drain timeout); with handlers far faster than the drain timeout,
// every release drains fully, so there must be none.
func (s *consumerSuite) churn(e *env) {
	t := e.t
	batches, perBatch := e.f.scale(400, 30), 25
	if testing.Short() {
		batches = e.f.scale(60, 30)
	}
	n := batches * perBatch
	b := e.newTopic(8)
	c := NewTally(n)

	steps := make(chan int)
	stepped := make(chan struct{})
	churned := make(chan []*ferry.Consumer)
	go func() {
		var live []*ferry.Consumer
		seq := 0
		for step := range steps {
			if len(live) < 2 || (step%3 != 0 && len(live) < 5) {
				seq++
				cn, err := b.NewConsumer("g", "t", c.Handler(), ferry.WithMemberID("m"+strconv.Itoa(seq)), ferry.WithConcurrency(2))
				if err != nil {
					t.Errorf("new consumer: %v", err)
				} else if err := cn.Start(context.Background()); err != nil {
					t.Errorf("start: %v", err)
					_ = cn.Close()
				} else {
					live = append(live, cn)
				}
			} else {
				if err := live[0].Close(); err != nil {
					t.Errorf("close %s: %v", live[0].MemberID(), err)
				}
				live = live[1:]
			}
			stepped <- struct{}{}
		}
		churned <- live
	}()

	p, err := b.NewProducer()
	must(t, err, "new producer")
	defer p.Close()
	for i := range batches {
		msgs := make([]*ferry.Message, perBatch)
		for j := range msgs {
			k := i*perBatch + j
			msgs[j] = &ferry.Message{Topic: "t", Key: "k" + strconv.Itoa(k%97), Body: []byte("m" + strconv.Itoa(k))}
		}
		_, err := p.SendBatch(context.Background(), msgs)
		if err != nil {
			close(steps)
			for _, cn := range <-churned {
				_ = cn.Close()
			}
			t.Fatalf("send batch: %v", err)
		}
		steps <- i // one join or leave between every two batches
		<-stepped
		e.w.progress()
	}
	close(steps)
	live := <-churned
	defer func() {
		for _, cn := range live {
			_ = cn.Close()
		}
	}()
	if len(live) == 0 {
		t.Fatal("no member live after the churn")
	}
	e.waitAll(c)
	for _, cn := range live {
		must(t, cn.Close(), "close")
	}
	check(t, c.Distinct() == n, "nothing lost: %d of %d handled", c.Distinct(), n)
	if _, exact := e.be.Cursors.(ferry.HandoffCursorStore); exact {
		check(t, c.Duplicates() == 0, "fully drained releases redeliver nothing: %d duplicates", c.Duplicates())
	} else {
		t.Logf("%d duplicates: %T is no ferry.HandoffCursorStore, so hand-overs are at least once", c.Duplicates(), e.be.Cursors)
	}
}
