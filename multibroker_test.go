package ferry_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cluster is several brokers in one process over one shared storage,
// cursor store and coordinator: they must behave as one broker.
type cluster struct {
	storage *ferry.MemoryStorage
	cursors *ferry.MemoryCursorStore
	coord   *ferry.MemoryCoordinator
	brokers []*ferry.Broker
}

func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{storage: ferry.NewMemoryStorage(), cursors: ferry.NewMemoryCursorStore(), coord: ferry.NewMemoryCoordinator()}
	t.Cleanup(func() {
		for _, b := range c.brokers {
			require.NoError(t, b.Close())
		}
		require.NoError(t, c.coord.Close())
		require.NoError(t, c.cursors.Close())
		require.NoError(t, c.storage.Close())
	})
	for range n {
		b, err := ferry.NewBroker(ferry.WithStorage(c.storage), ferry.WithCursorStore(c.cursors), ferry.WithCoordinator(c.coord))
		require.NoError(t, err)
		c.brokers = append(c.brokers, b)
	}
	return c
}

// A topic created through one broker is found by the others, and creating
// it again with other metadata is refused everywhere.
func TestClusterSharesTopics(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, 2)
	meta := ferry.TopicMeta{Name: "t", Queues: 4}
	require.NoError(t, c.brokers[0].CreateTopic(ctx, meta))
	got, ok := c.brokers[1].Topic("t")
	require.True(t, ok, "the other broker finds the topic")
	assert.True(t, meta.Matches(got), "got %+v", got)
	assert.NotZero(t, got.Incarnation, "CreateTopic gives the topic an incarnation")
	require.NoError(t, c.brokers[1].CreateTopic(ctx, meta), "equal metadata: idempotent")
	require.ErrorIs(t, c.brokers[1].CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 8}), ferry.ErrTopicExists)

	// A topic created elsewhere after this broker started is found on send.
	require.NoError(t, c.brokers[1].CreateTopic(ctx, ferry.TopicMeta{Name: "later", Queues: 1}))
	p, err := c.brokers[0].NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "later", Body: []byte("x")})
	require.NoError(t, err)
	_, err = p.Send(ctx, &ferry.Message{Topic: "nowhere", Body: []byte("x")})
	require.ErrorIs(t, err, ferry.ErrTopicNotFound)
}

// A group whose members sit in different brokers splits the queues, one
// owner each, and with stable members every message is handled once.
func TestClusterGroupSplitsQueues(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, 3)
	require.NoError(t, c.brokers[0].CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 12}))
	const n = 3000
	tl := newTally(n)
	var consumers []*ferry.Consumer
	for i, b := range c.brokers {
		for j := range 2 {
			cn, err := b.NewConsumer("g", "t", tl.handler(), ferry.WithMemberID("m"+strconv.Itoa(i)+strconv.Itoa(j)))
			require.NoError(t, err)
			require.NoError(t, cn.Start(ctx))
			defer cn.Close()
			consumers = append(consumers, cn)
		}
	}
	require.Eventually(t, func() bool {
		if len(union(t, consumers...)) != 12 {
			return false
		}
		for _, cn := range consumers {
			if len(cn.Assigned()) != 2 {
				return false // still settling: a member takes its queues as the others let them go
			}
		}
		return true
	}, watchdog, time.Millisecond, "every queue has one owner across the brokers, two each")
	produce(t, c.brokers[1], "t", "m", n, 97)
	tl.waitAll(t)
	assert.Zero(t, tl.duplicates())
}

// Members join and leave across brokers while messages flow: nothing is
// lost, and with handlers far faster than the drain timeout nothing is
// handled twice. Ordered, broadcast and pull members too.
func TestClusterChurn(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, 3)
	require.NoError(t, c.brokers[0].CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 8}))
	const batches, per = 60, 20
	n := batches * per
	conc, ord := newTally(n), newTally(n)
	fanA, fanB := newTally(n), newTally(n)
	pulled := newTally(n)
	var mu sync.Mutex
	var live []*ferry.Consumer
	start := func(i int) {
		b := c.brokers[i%3]
		cn, err := b.NewConsumer("conc", "t", conc.handler(), ferry.WithMemberID("c"+strconv.Itoa(i)))
		require.NoError(t, err)
		require.NoError(t, cn.Start(ctx))
		on, err := b.NewConsumer("ord", "t", ord.handler(), ferry.WithMemberID("o"+strconv.Itoa(i)), ferry.Ordered())
		require.NoError(t, err)
		require.NoError(t, on.Start(ctx))
		mu.Lock()
		live = append(live, cn, on)
		mu.Unlock()
	}
	for _, fan := range []struct {
		b  *ferry.Broker
		id string
		tl *tally
	}{{c.brokers[0], "a", fanA}, {c.brokers[2], "b", fanB}} {
		cn, err := fan.b.NewConsumer("fan", "t", fan.tl.handler(), ferry.Broadcast(), ferry.WithMemberID(fan.id))
		require.NoError(t, err)
		require.NoError(t, cn.Start(ctx))
		defer cn.Close()
	}
	pctx, stopPull := context.WithCancel(ctx)
	var pulling sync.WaitGroup
	for i, b := range c.brokers[:2] {
		pc, err := b.NewPullConsumer("pull", "t", ferry.WithMemberID("p"+strconv.Itoa(i)))
		require.NoError(t, err)
		defer pc.Close()
		pulling.Add(1)
		go func() {
			defer pulling.Done()
			for pctx.Err() == nil {
				msgs, err := pc.Poll(pctx, 16)
				if err != nil {
					continue
				}
				for _, m := range msgs {
					pulled.add(string(m.Body))
				}
				_ = pc.Commit(ctx, msgs...)
			}
		}()
	}
	start(0)
	start(1)
	p, err := c.brokers[2].NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for i := range batches {
		msgs := make([]*ferry.Message, per)
		for j := range msgs {
			k := i*per + j
			msgs[j] = &ferry.Message{Topic: "t", Key: "k" + strconv.Itoa(k%31), Body: []byte("m" + strconv.Itoa(k))}
		}
		_, err := p.SendBatch(ctx, msgs)
		require.NoError(t, err)
		mu.Lock()
		churn := len(live) > 4 && i%3 == 0
		var gone []*ferry.Consumer
		if churn {
			gone, live = live[:2], live[2:]
		}
		mu.Unlock()
		for _, cn := range gone {
			require.NoError(t, cn.Close())
		}
		if !churn {
			start(i + 2)
		}
	}
	for _, tl := range []*tally{conc, ord, fanA, fanB, pulled} {
		tl.waitAll(t)
	}
	stopPull()
	pulling.Wait()
	mu.Lock()
	for _, cn := range live {
		require.NoError(t, cn.Close())
	}
	mu.Unlock()
	assert.Zero(t, conc.duplicates(), "fully drained releases redeliver nothing")
	assert.Zero(t, ord.duplicates(), "fully drained releases redeliver nothing")
	assert.Zero(t, fanA.duplicates()+fanB.duplicates())
}

// A group consuming through one broker holds back a Block topic for
// producers of every broker.
func TestClusterBlockHeldByEveryBrokersGroups(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, 2)
	require.NoError(t, c.brokers[0].CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1,
		Retention: ferry.Retention{MaxMessages: 8, Overflow: ferry.Block}}))
	// Group "slow" consumed 2 messages through broker 1 and left.
	produce(t, c.brokers[0], "t", "a", 2, 1)
	slow := newTally(2)
	cs, err := c.brokers[1].NewConsumer("slow", "t", slow.handler())
	require.NoError(t, err)
	require.NoError(t, cs.Start(ctx))
	slow.waitAll(t)
	require.Eventually(t, func() bool {
		offs, err := c.cursors.Load(ctx, "t", "slow", 1)
		return err == nil && offs[0] == 2
	}, watchdog, time.Millisecond)
	require.NoError(t, cs.Close())

	// Group "fast" reads everything through broker 0.
	fast := newTally(8) // from the oldest retained: what slow released
	startConsumerOn(t, c.brokers[0], "fast", fast.handler())
	p, err := c.brokers[0].NewProducer()
	require.NoError(t, err)
	defer p.Close()
	sent := 0
	for ; sent < 50; sent++ {
		_, err := p.TrySend(&ferry.Message{Topic: "t", Body: []byte("b" + strconv.Itoa(sent))})
		if errors.Is(err, ferry.ErrQueueFull) {
			break
		}
		require.NoError(t, err)
	}
	assert.Equal(t, 8, sent, "slow, at offset 2 through another broker, holds the topic at 8 messages")
	fast.waitAll(t)
	require.Eventually(t, func() bool {
		offs, err := c.cursors.Load(ctx, "t", "fast", 1)
		return err == nil && offs[0] == 10
	}, watchdog, time.Millisecond)
	require.NoError(t, c.brokers[1].ForgetGroup(ctx, "slow", "t"))
	_, err = p.TrySend(&ferry.Message{Topic: "t", Body: []byte("after")})
	require.NoError(t, err, "once slow is forgotten, the fast group alone holds the topic")
}
