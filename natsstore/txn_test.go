package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestTransactionalNodeKill runs a Transactional group of two members over
// three NATS server processes (R3 streams) while producers send, and
// SIGKILLs the leader of the stream of the group's transaction log for
// queue 0 mid-flight. Each handler call sends two outputs, tagged with the
// call; an input's first call fails after sending one time in four. The
// documented guarantee (see ferry.Transactional): a reader of the output
// topic sees, for every input stored, the two outputs of exactly one call
// that returned nil, each once, and no output of a call that failed.
func TestTransactionalNodeKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: server processes, Raft elections")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	began := time.Now()
	c := startProcCluster(t, ctx)
	t.Logf("cluster of 3 processes up in %v", time.Since(began).Round(10*time.Millisecond))

	const prefix, group, queues, producers = "tx", "billing", 2, 2
	opts := []natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithReplicas(3)}
	var warns lines // the brokers' warnings and errors
	defer func() {
		if t.Failed() {
			for _, w := range warns.get() {
				t.Log("broker: " + w)
			}
		}
	}()
	newBroker := func() *ferry.Broker {
		js, err := jetstream.New(c.connect(t))
		require.NoError(t, err)
		st, err := natsstore.Open(ctx, js, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = st.Close() })
		co, err := natsstore.NewCoordinator(ctx, js, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = co.Close() })
		b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co),
			ferry.WithLogger(slog.New(slog.NewTextHandler(&warns, &slog.HandlerOptions{Level: slog.LevelWarn}))))
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	b1, b2 := newBroker(), newBroker()
	in := ferry.TopicMeta{Name: "in", Queues: queues}
	out := ferry.TopicMeta{Name: "out", Queues: queues}
	for _, b := range []*ferry.Broker{b1, b2} {
		require.NoError(t, b.CreateTopic(ctx, in))
		require.NoError(t, b.CreateTopic(ctx, out))
	}

	// calls[input] lists the input's handler calls: their ids, and
	// whether each returned nil.
	type call struct {
		id int64
		ok bool
	}
	var (
		mu     sync.Mutex
		calls  = map[string][]call{}
		okAt   [queues]time.Time // the last call that returned nil, per queue
		okN    int
		nextID atomic.Int64
	)
	fails := func(body string) bool { // the first call fails, one input in four
		n, _ := strconv.Atoi(body[strings.IndexByte(body, '-')+1:])
		return n%4 == 0
	}
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		id := nextID.Add(1)
		body := string(m.Body)
		mu.Lock()
		first := len(calls[body]) == 0
		calls[body] = append(calls[body], call{id: id})
		i := len(calls[body]) - 1
		mu.Unlock()
		ob := ferry.OutboxFrom(ctx)
		for k := range 2 {
			if err := ob.Send(&ferry.Message{Topic: "out", Key: m.Key, Body: fmt.Appendf(nil, "%s/%d/%d", body, id, k)}); err != nil {
				return err
			}
		}
		if first && fails(body) {
			return errors.New("the first call fails after sending")
		}
		mu.Lock()
		calls[body][i].ok = true
		okAt[m.Queue] = time.Now()
		okN++
		mu.Unlock()
		return nil
	})
	t.Logf("topics created %v in", time.Since(began).Round(10*time.Millisecond))
	var consumers []*ferry.Consumer
	for i, b := range []*ferry.Broker{b1, b2} {
		cons, err := b.NewConsumer(group, "in", h, ferry.Transactional(), ferry.OrderedByKey(), ferry.WithConcurrency(16), ferry.WithRetry(50, 10*time.Millisecond), ferry.WithMemberID(fmt.Sprintf("m%d", i+1)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cons.Close() })
		require.NoError(t, cons.Start(ctx))
		consumers = append(consumers, cons)
	}
	awaitCond(t, ctx, "two consumers split the queues", func() (bool, string) {
		a, b := len(consumers[0].Assigned()), len(consumers[1].Assigned())
		return a == 1 && b == 1, fmt.Sprintf("assigned %d and %d", a, b)
	})

	// Producers send keyed messages until stop, every 10 ms each; a send
	// that fails (the kill) may or may not be stored: what counts is
	// what the input topic holds.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var acked, failed atomic.Int64
	for i := range producers {
		p, err := b1.NewProducer()
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				body := fmt.Sprintf("p%d-%d", i, n)
				sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := p.Send(sctx, &ferry.Message{Topic: "in", Key: body, Body: []byte(body)})
				scancel()
				if err != nil {
					failed.Add(1)
				} else {
					acked.Add(1)
				}
			}
		})
	}
	stopped := false
	stopProducers := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopProducers()
	// resumed reports whether calls returned nil on every queue since at.
	resumed := func(at time.Time) (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for q := range queues {
			if !okAt[q].After(at) {
				return false, fmt.Sprintf("queue %d: no call returned nil since %v (%d did in all)", q, at.Format("15:04:05.000"), okN)
			}
		}
		return true, ""
	}
	t.Logf("consumers split the queues %v in", time.Since(began).Round(10*time.Millisecond))
	awaitCond(t, ctx, "calls returning nil on every queue", func() (bool, string) { return resumed(time.Now().Add(-500 * time.Millisecond)) })

	// SIGKILL the leader of the log's stream for queue 0.
	js, err := jetstream.New(c.connect(t))
	require.NoError(t, err)
	logTopic, err := ferry.TransactionLog(group, "in")
	require.NoError(t, err)
	stream := natsstore.StreamName(prefix, logTopic, 0)
	var leader string
	awaitCond(t, ctx, "leader of "+stream, func() (bool, string) {
		ictx, icancel := context.WithTimeout(ctx, time.Second)
		defer icancel()
		s, err := js.Stream(ictx, stream)
		if err != nil {
			return false, err.Error()
		}
		info, err := s.Info(ictx)
		if err != nil {
			return false, err.Error()
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return false, "no leader"
		}
		leader = info.Cluster.Leader
		return true, ""
	})
	c.byName(leader).kill()
	killed := time.Now()
	mu.Lock()
	before := okN
	mu.Unlock()
	awaitCond(t, ctx, "calls returning nil on every queue after the kill", func() (bool, string) { return resumed(killed) })
	t.Logf("SIGKILLed %s, the leader of %s, after %d calls returned nil; calls returned nil on every queue again %v later",
		leader, stream, before, time.Since(killed).Round(10*time.Millisecond))
	time.Sleep(500 * time.Millisecond) // a little more traffic, then stop
	stopProducers()

	// Read both topics back through a Store of its own.
	js2, err := jetstream.New(c.connect(t))
	require.NoError(t, err)
	st, err := natsstore.Open(ctx, js2, opts...)
	require.NoError(t, err)
	defer st.Close()
	read := func(meta ferry.TopicMeta, f func(string)) {
		for q := range meta.Queues {
			fq, err := st.OpenQueue(ctx, meta, q)
			require.NoError(t, err)
			_, next := fq.Offsets()
			dst := make([]*ferry.EnhancedMessage, 256)
			for off := int64(0); off < next; {
				n, err := fq.Read(ctx, off, dst)
				require.NoError(t, err, "%s[%d] offset %d", meta.Name, q, off)
				for _, m := range dst[:n] {
					f(string(m.Body))
					off = m.Offset + 1
				}
			}
			require.NoError(t, fq.Close())
		}
	}
	drain := time.Now()
	inputs := map[string]int{}
	read(in, func(body string) { inputs[body]++ })

	// The group finishes every input stored: a call returned nil for
	// each, and the output topic holds as many outputs as they make (an
	// input finishes after its outputs are written; its cursor may lag
	// behind, a failed commit being tried again only at the next finish
	// or at the release, so the cursors are no sign of it). A duplicate
	// would stop this wait early, and fail the checks below.
	var outQueues []ferry.Queue
	for q := range out.Queues {
		fq, err := st.OpenQueue(ctx, out, q)
		require.NoError(t, err)
		defer fq.Close()
		outQueues = append(outQueues, fq)
	}
	awaitCond(t, ctx, "every input finished", func() (bool, string) {
		mu.Lock()
		for body := range inputs {
			if !slices.ContainsFunc(calls[body], func(cl call) bool { return cl.ok }) {
				mu.Unlock()
				return false, "no call returned nil for " + body
			}
		}
		mu.Unlock()
		n := int64(0)
		for _, fq := range outQueues {
			_, next := fq.Offsets()
			n += next
		}
		return n >= int64(2*len(inputs)), fmt.Sprintf("%d outputs stored for %d inputs", n, len(inputs))
	})
	t.Logf("every input finished %v after the producers stopped", time.Since(drain).Round(10*time.Millisecond))
	for _, cons := range consumers {
		require.NoError(t, cons.Close())
	}
	type output struct {
		id int64
		k  int
	}
	outputs := map[string]map[output]int{} // input → its outputs → copies
	read(out, func(body string) {
		f := strings.Split(body, "/")
		require.Len(t, f, 3, "output %q", body)
		id, err1 := strconv.ParseInt(f[1], 10, 64)
		k, err2 := strconv.Atoi(f[2])
		require.NoError(t, errors.Join(err1, err2), "output %q", body)
		if outputs[f[0]] == nil {
			outputs[f[0]] = map[output]int{}
		}
		outputs[f[0]][output{id, k}]++
	})

	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, int64(len(inputs)), acked.Load(), "every acknowledged input stored")
	failedCalls, again := 0, 0
	var wrong []string // what breaks the guarantee, input by input
	for body, n := range inputs {
		cs := calls[body]
		var ids []int64
		copies := 0
		for o, n := range outputs[body] {
			copies += n
			if !slices.Contains(ids, o.id) {
				ids = append(ids, o.id)
			}
		}
		ok := n == 1 && len(ids) == 1 && len(outputs[body]) == 2 && copies == 2
		for _, cl := range cs {
			if len(ids) == 1 && cl.id == ids[0] && !cl.ok {
				ok = false
			}
			if !cl.ok {
				failedCalls++
			}
		}
		if !ok {
			wrong = append(wrong, fmt.Sprintf("input %s stored %d times: calls %v, outputs (call, index → copies) %v", body, n, cs, outputs[body]))
		}
		again += max(len(cs)-1, 0)
	}
	slices.Sort(wrong)
	require.Empty(t, wrong, "inputs whose outputs are not those of exactly one call that returned nil, each once")
	for body := range outputs {
		require.Contains(t, inputs, body, "outputs of an input not stored")
	}
	require.Positive(t, failedCalls, "some calls failed after sending")
	t.Logf("%d inputs stored (%d sends acknowledged, %d failed), each with the 2 outputs of one call that returned nil, once; %d calls failed after sending, %d calls beyond the first; took %v",
		len(inputs), acked.Load(), failed.Load(), failedCalls, again, time.Since(began).Round(100*time.Millisecond))
}
