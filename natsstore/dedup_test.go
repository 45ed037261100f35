package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// connectURL returns a JetStream over a new connection to url, closed
// when t ends.
func connectURL(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

func keyedMsgs(topic string, keys ...string) []*ferry.EnhancedMessage {
	ms := newMsgs(topic, len(keys))
	for i, k := range keys {
		ms[i].DedupKey = k
	}
	return ms
}

func dupsOf(first int64, msgs []*ferry.EnhancedMessage) []bool {
	d := make([]bool, len(msgs))
	ferry.Duplicates(first, msgs, func(i int) { d[i] = true })
	return d
}

// TestDedupRetriedSend: a Send whose ack does not come in time (its
// connection held) fails with its outcome unknown, and is stored when
// the connection heals; the Send retried with the same DedupKey stores
// nothing and reports the first copy: Duplicate, its offset and its ID.
func TestDedupRetriedSend(t *testing.T) {
	c := singleServer(t)
	prefix := fmt.Sprintf("dr%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	px := newHoldProxy(t, c.servers[0].Addr().String())
	st, err := natsstore.Open(t.Context(), connectURL(t, px.url()), natsstore.WithPrefix(prefix))
	require.NoError(t, err)
	defer st.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()

	px.hold()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("pay 10"), DedupKey: "order-1"})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a Send with its connection held")
	px.heal() // the held publish lands now

	res, err := p.Send(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("pay 10"), DedupKey: "order-1"})
	require.NoError(t, err)
	require.True(t, res.Duplicate, "the retried Send: %+v", res)
	require.Equal(t, int64(0), res.Offset)

	q, err := st.OpenQueue(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}, 0)
	require.NoError(t, err)
	defer q.Close()
	oldest, next := q.Offsets()
	require.Equal(t, [2]int64{0, 1}, [2]int64{oldest, next}, "stored once")
	dst := make([]*ferry.EnhancedMessage, 1)
	_, err = q.Read(t.Context(), 0, dst)
	require.NoError(t, err)
	require.Equal(t, dst[0].ID, res.ID, "the duplicate reports the first copy's ID")
	require.Equal(t, "order-1", dst[0].DedupKey)

	// And a new key after it goes on.
	res, err = p.Send(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("pay 20"), DedupKey: "order-2"})
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.Equal(t, int64(1), res.Offset)
}

// TestDedupRetriedBatch: a batch of keyed messages whose Write timed out
// (the connection held) is stored when the connection heals; written
// again (the same messages, as the Write doc says to learn their
// offsets), it is found as stored by that Write, not as duplicates; a
// batch mixing keys stored before with new ones stores the new ones
// only, as one batch, and reports the others at their first copies.
func TestDedupRetriedBatch(t *testing.T) {
	for _, cl := range []struct {
		name string
		c    func(testing.TB) *cluster
	}{{"Single", singleServer}, {"Cluster", tripleServer}} {
		t.Run(cl.name, func(t *testing.T) {
			if cl.name == "Cluster" && testing.Short() {
				t.Skip("-short: no cluster")
			}
			c := cl.c(t)
			prefix := fmt.Sprintf("db%d", fresh.Add(1))
			dropDeployment(t, c, prefix)
			px := newHoldProxy(t, c.servers[0].Addr().String())
			opts := []natsstore.Option{natsstore.WithPrefix(prefix)}
			if len(c.servers) == 3 {
				opts = append(opts, natsstore.WithReplicas(3), natsstore.WithOpTimeout(10*time.Second))
			}
			st, err := natsstore.Open(t.Context(), connectURL(t, px.url()), opts...)
			require.NoError(t, err)
			defer st.Close()
			meta := ferry.TopicMeta{Name: "orders", Queues: 1}
			q, err := st.OpenQueue(t.Context(), meta, 0)
			require.NoError(t, err)
			defer q.Close()

			batch := keyedMsgs("orders", "a", "b", "")
			px.hold()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			_, err = q.Write(ctx, batch)
			cancel()
			require.ErrorIs(t, err, context.DeadlineExceeded, "a Write with its connection held")
			px.heal()
			first, err := q.Write(t.Context(), batch)
			require.NoError(t, err)
			require.Equal(t, int64(0), first)
			require.Equal(t, []bool{false, false, false}, dupsOf(first, batch), "the batch written again is the Write's own")
			oldest, next := q.Offsets()
			require.Equal(t, [2]int64{0, 3}, [2]int64{oldest, next})

			mixed := keyedMsgs("orders", "c", "b", "", "a", "c")
			first, err = q.Write(t.Context(), mixed)
			require.NoError(t, err)
			require.Equal(t, int64(3), first)
			require.Equal(t, []bool{false, true, false, true, true}, dupsOf(first, mixed))
			for _, d := range []struct{ dup, orig *ferry.EnhancedMessage }{{mixed[1], batch[1]}, {mixed[3], batch[0]}, {mixed[4], mixed[0]}} {
				require.Equal(t, [3]any{d.orig.Offset, d.orig.ID, d.orig.StoreUnixNano}, [3]any{d.dup.Offset, d.dup.ID, d.dup.StoreUnixNano}, "duplicate %s", d.dup.DedupKey)
			}
			require.Equal(t, [2]int64{3, 4}, [2]int64{mixed[0].Offset, mixed[2].Offset})
			oldest, next = q.Offsets()
			require.Equal(t, [2]int64{0, 5}, [2]int64{oldest, next})
		})
	}
}

// TestDedupWindowShared: the topic's DedupWindow is kept with the topic,
// so another Store of the deployment sees it, and is the stream's
// duplicate window (at least JetStream's 100 ms; capped by MaxAge);
// DedupOff stores every message and keeps the store's window for
// retried writes.
func TestDedupWindowShared(t *testing.T) {
	c := singleServer(t)
	prefix := fmt.Sprintf("dw%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	ctx := t.Context()
	a := openStore(t, c, prefix)
	defer a.Close()
	b := openStore(t, c, prefix)
	defer b.Close()
	js := c.connect(t)
	for _, tc := range []struct {
		meta   ferry.TopicMeta
		window time.Duration // DedupWindow()
		stream time.Duration // the stream's Duplicates
	}{
		{ferry.TopicMeta{Name: "hour", Queues: 1, DedupWindow: time.Hour}, time.Hour, time.Hour},
		{ferry.TopicMeta{Name: "default", Queues: 1}, ferry.DefaultDedupWindow, ferry.DefaultDedupWindow},
		{ferry.TopicMeta{Name: "short", Queues: 1, DedupWindow: 20 * time.Millisecond}, 20 * time.Millisecond, 100 * time.Millisecond},
		{ferry.TopicMeta{Name: "aged", Queues: 1, DedupWindow: time.Hour, Retention: ferry.Retention{MaxAge: time.Minute}}, time.Hour, time.Minute},
		{ferry.TopicMeta{Name: "off", Queues: 1, DedupWindow: ferry.DedupOff}, 0, natsstore.DefaultDupWindow},
	} {
		require.NoError(t, a.CreateTopic(ctx, tc.meta))
		seen, err := b.Topic(ctx, tc.meta.Name)
		require.NoError(t, err)
		require.Equal(t, tc.meta.DedupWindow, seen.DedupWindow, "topic %s as another Store reads it", tc.meta.Name)
		q, err := b.OpenQueue(ctx, seen, 0)
		require.NoError(t, err)
		require.Equal(t, tc.window, q.(ferry.Deduplicator).DedupWindow(), "topic %s", tc.meta.Name)
		h, err := js.Stream(ctx, natsstore.StreamOf(q))
		require.NoError(t, err)
		info, err := h.Info(ctx)
		require.NoError(t, err)
		require.Equal(t, tc.stream, info.Config.Duplicates, "topic %s: the stream's window", tc.meta.Name)
		if tc.window == 0 {
			ms := keyedMsgs(tc.meta.Name, "x", "x")
			first, err := q.Write(ctx, ms)
			require.NoError(t, err)
			require.Equal(t, []bool{false, false}, dupsOf(first, ms), "DedupOff stores every message")
		}
		require.NoError(t, q.Close())
	}
}

// TestDedupServerRestart: keys stored before the server restarts are
// duplicates after it (JetStream rebuilds its window from the stored
// messages), reported at their first copies; the window is the topic's
// still.
func TestDedupServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a server of its own")
	}
	dir := t.TempDir()
	port := freePort(t)
	start := func() *server.Server {
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, JetStreamMaxStore: testMaxStore, NoLog: true, NoSigs: true})
		require.NoError(t, err)
		s.Start()
		require.True(t, s.ReadyForConnections(10*time.Second), "nats server not ready")
		return s
	}
	srv := start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	ctx := t.Context()
	meta := ferry.TopicMeta{Name: "orders", Queues: 1, DedupWindow: time.Hour}

	st, err := natsstore.Open(ctx, connectURL(t, srv.ClientURL()))
	require.NoError(t, err)
	require.NoError(t, st.CreateTopic(ctx, meta))
	q, err := st.OpenQueue(ctx, meta, 0)
	require.NoError(t, err)
	before := keyedMsgs("orders", "a", "b")
	_, err = q.Write(ctx, before)
	require.NoError(t, err)
	require.NoError(t, q.Close())
	require.NoError(t, st.Close())

	srv.Shutdown()
	srv.WaitForShutdown()
	srv = start()

	st, err = natsstore.Open(ctx, connectURL(t, srv.ClientURL()))
	require.NoError(t, err)
	defer st.Close()
	seen, err := st.Topic(ctx, "orders")
	require.NoError(t, err)
	q, err = st.OpenQueue(ctx, seen, 0)
	require.NoError(t, err)
	defer q.Close()
	require.Equal(t, time.Hour, q.(ferry.Deduplicator).DedupWindow())
	for i, after := range [][]*ferry.EnhancedMessage{keyedMsgs("orders", "b"), keyedMsgs("orders", "b", "a", "c")} {
		first, err := q.Write(ctx, after)
		require.NoError(t, err)
		want := []bool{true, true, false}[:len(after)]
		require.Equal(t, want, dupsOf(first, after), "write %d after the restart", i)
		require.Equal(t, [2]any{before[1].Offset, before[1].ID}, [2]any{after[0].Offset, after[0].ID}, "b after the restart")
		if len(after) > 1 {
			require.Equal(t, [2]any{before[0].Offset, before[0].ID}, [2]any{after[1].Offset, after[1].ID}, "a after the restart")
			require.Equal(t, int64(2), after[2].Offset)
		}
	}
	_, next := q.Offsets()
	require.Equal(t, int64(3), next)
}

// TestDedupWriteAsyncOrder: a batch with keys, one of them stored
// before, goes through WriteAsync in line with the pipelined writes
// around it: every write is stored in the order begun and reported in
// that order, the duplicate at its first copy.
func TestDedupWriteAsyncOrder(t *testing.T) {
	c := singleServer(t)
	prefix := fmt.Sprintf("da%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	st := openStore(t, c, prefix)
	defer st.Close()
	ctx := t.Context()
	q, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: "orders", Queues: 1}, 0)
	require.NoError(t, err)
	defer q.Close()
	aw := q.(ferry.AsyncWriter)
	first := keyedMsgs("orders", "a")
	_, err = q.Write(ctx, first)
	require.NoError(t, err)

	writes := [][]*ferry.EnhancedMessage{
		newMsgs("orders", 2),
		keyedMsgs("orders", "b", "a", "c"), // a: a duplicate; the batch is refused whole once
		newMsgs("orders", 1),
		keyedMsgs("orders", "d"),
		newMsgs("orders", 3),
	}
	type outcome struct {
		k     int
		first int64
		err   error
	}
	got := make(chan outcome, len(writes))
	for k, w := range writes {
		aw.WriteAsync(ctx, w, func(first int64, err error) { got <- outcome{k, first, err} })
	}
	next := int64(1)
	for i := range writes {
		o := <-got
		require.NoError(t, o.err, "write %d", o.k)
		require.Equal(t, i, o.k, "reported in the order begun")
		require.Equal(t, next, o.first, "write %d: stored in the order begun", o.k)
		for j, m := range writes[o.k] {
			if o.k == 1 && j == 1 {
				require.Equal(t, [2]any{first[0].Offset, first[0].ID}, [2]any{m.Offset, m.ID}, "the duplicate")
				continue
			}
			require.Equal(t, next, m.Offset, "write %d message %d", o.k, j)
			next++
		}
	}
	_, end := q.Offsets()
	require.Equal(t, next, end)
}

// TestDedupRetriedDelayedSend: the same for a delayed message, whose
// Send writes it to a delay level: the retried Send finds the first copy
// there and reports it (its level, offset and ID); the level holds it
// once.
func TestDedupRetriedDelayedSend(t *testing.T) {
	c := singleServer(t)
	prefix := fmt.Sprintf("dr%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	px := newHoldProxy(t, c.servers[0].Addr().String())
	st, err := natsstore.Open(t.Context(), connectURL(t, px.url()), natsstore.WithPrefix(prefix))
	require.NoError(t, err)
	defer st.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "orders", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	at := time.Now().Add(time.Hour)
	before, err := p.Send(t.Context(), &ferry.Message{Topic: "orders", DedupKey: "order-0", DeliverAt: at}) // creates the level
	require.NoError(t, err)

	px.hold()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = p.Send(ctx, &ferry.Message{Topic: "orders", Body: []byte("remind"), DedupKey: "order-1", DeliverAt: at})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a Send with its connection held")
	px.heal()

	res, err := p.Send(t.Context(), &ferry.Message{Topic: "orders", Body: []byte("remind"), DedupKey: "order-1", DeliverAt: at})
	require.NoError(t, err)
	require.True(t, res.Duplicate, "the retried Send: %+v", res)
	require.Equal(t, before.Queue, res.Queue, "in the level the first waits in")
	require.Equal(t, before.Offset+1, res.Offset)

	lv, ok := b.Topic(res.Queue.Topic)
	require.True(t, ok)
	q, err := st.OpenQueue(t.Context(), lv, 0)
	require.NoError(t, err)
	defer q.Close()
	oldest, next := q.Offsets()
	require.Equal(t, [2]int64{before.Offset, res.Offset + 1}, [2]int64{oldest, next}, "stored once")
	dst := make([]*ferry.EnhancedMessage, 1)
	_, err = q.Read(t.Context(), res.Offset, dst)
	require.NoError(t, err)
	require.Equal(t, dst[0].ID, res.ID, "the duplicate reports the first copy's ID")
}
