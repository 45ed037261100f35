package natsstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// The test binary re-executes itself as a NATS server when serverEnv
// holds "<name> <client port> <route port> <routes> <store dir>" (see
// serverMain).
const serverEnv = "FERRY_NATS_SERVER"

// serverMain runs one clustered JetStream server until its stdin closes
// (the test closed it, or died) or it is killed.
func serverMain() int {
	f := strings.Fields(os.Getenv(serverEnv))
	if len(f) != 5 {
		fmt.Fprintf(os.Stderr, "%s: want 5 fields, got %q\n", serverEnv, f)
		return 2
	}
	port, _ := strconv.Atoi(f[1])
	rport, _ := strconv.Atoi(f[2])
	s, err := server.NewServer(&server.Options{
		ServerName: f[0], Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: f[4], NoLog: true, NoSigs: true,
		Cluster: server.ClusterOpts{Name: "ferry", Host: "127.0.0.1", Port: rport},
		Routes:  server.RoutesFromStr(f[3]),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s.Start()
	_, _ = io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

// serverProc is one NATS server process; it keeps its name, ports and
// store dir across restarts.
type serverProc struct {
	name        string
	port, rport int
	routes, dir string
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	done        chan struct{}
}

func (p *serverProc) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", p.port) }

func (p *serverProc) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %s %s", serverEnv, p.name, p.port, p.rport, p.routes, p.dir))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p.cmd, p.stdin, p.done = cmd, stdin, make(chan struct{})
	done := p.done
	go func() { _ = cmd.Wait(); close(done) }()
}

// kill SIGKILLs the process and waits for it to end.
func (p *serverProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	p.cmd = nil
}

// awaitPort waits until the server takes connections.
func (p *serverProc) awaitPort(t *testing.T, ctx context.Context) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-tick.C:
		case <-p.done:
			t.Fatalf("server %s exited", p.name)
		case <-ctx.Done():
			t.Fatalf("server %s not listening: %v", p.name, err)
		}
	}
}

type procCluster struct{ procs []*serverProc }

// startProcCluster starts three server processes on loopback ports picked
// beforehand, killed when t ends, and waits for the JetStream meta leader.
func startProcCluster(t *testing.T, ctx context.Context) *procCluster {
	t.Helper()
	c := &procCluster{}
	rports := make([]string, 3)
	for i := range 3 {
		p := &serverProc{name: fmt.Sprintf("n%d", i), port: freePort(t), rport: freePort(t), dir: t.TempDir()}
		rports[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p.rport)
		c.procs = append(c.procs, p)
	}
	t.Cleanup(func() {
		for _, p := range c.procs {
			p.kill()
		}
	})
	for _, p := range c.procs {
		p.routes = strings.Join(rports, ",")
		p.start(t)
	}
	for _, p := range c.procs {
		p.awaitPort(t, ctx)
	}
	nc := c.connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	awaitCond(t, ctx, "JetStream meta leader", func() (bool, string) {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := js.AccountInfo(actx)
		return err == nil, fmt.Sprint(err)
	})
	// The meta leader answers before it knows every peer: R3 placement
	// fails ("no suitable peers") until it does.
	awaitCond(t, ctx, "three JetStream peers", func() (bool, string) {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.CreateStream(actx, jetstream.StreamConfig{Name: "probe", Replicas: 3, Storage: jetstream.MemoryStorage})
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	require.NoError(t, js.DeleteStream(ctx, "probe"))
	return c
}

func (c *procCluster) url() string {
	us := make([]string, len(c.procs))
	for i, p := range c.procs {
		us[i] = p.url()
	}
	return strings.Join(us, ",")
}

func (c *procCluster) byName(name string) *serverProc {
	for _, p := range c.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// connect returns a connection to all three servers, closed when t ends.
func (c *procCluster) connect(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.url(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// awaitCond polls ok until it holds, failing at ctx's end with what ok
// said last.
func awaitCond(t *testing.T, ctx context.Context, what string, ok func() (bool, string)) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		done, why := ok()
		if done {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			if os.Getenv("NFDUMP") != "" {
				_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			}
			t.Fatalf("%s: %s", what, why)
		}
	}
}

// caughtUp tells whether every stream has a leader and three peers, all
// current with no lag, name among them.
func caughtUp(ctx context.Context, js jetstream.JetStream, name string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	l := js.ListStreams(ctx)
	n := 0
	for info := range l.Info() {
		n++
		ci := info.Cluster
		if ci == nil || ci.Leader == "" {
			return false, info.Config.Name + ": no leader"
		}
		peers := []string{ci.Leader}
		for _, r := range ci.Replicas {
			if !r.Current || r.Offline || r.Lag > 0 {
				return false, fmt.Sprintf("%s: peer %s current %v offline %v lag %d", info.Config.Name, r.Name, r.Current, r.Offline, r.Lag)
			}
			peers = append(peers, r.Name)
		}
		if len(peers) != 3 || !slices.Contains(peers, name) {
			return false, fmt.Sprintf("%s: peers %v", info.Config.Name, peers)
		}
	}
	if err := l.Err(); err != nil {
		return false, err.Error()
	}
	return n > 0, "no streams"
}

// lines collects what is written to it, line by line.
type lines struct {
	mu sync.Mutex
	ls []string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ls = append(l.ls, strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (l *lines) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ls)
}

// record is an acknowledged send or a handling.
type record struct {
	body string
	at   time.Time
}

// ledger keeps, per queue, what was acknowledged at which offset and what
// the group handled.
type ledger struct {
	mu      sync.Mutex
	acked   []map[int64]record // queue -> offset -> send
	handled []map[int64]record // queue -> offset -> first handling
	times   [][]time.Time      // queue -> ack times, in order per producer
	htimes  [][]time.Time      // queue -> handling times
	redo    int                // handlings beyond the first
	wake    chan struct{}
}

func newLedger(queues int) *ledger {
	l := &ledger{wake: make(chan struct{}, 1)}
	for range queues {
		l.acked = append(l.acked, map[int64]record{})
		l.handled = append(l.handled, map[int64]record{})
	}
	l.times = make([][]time.Time, queues)
	l.htimes = make([][]time.Time, queues)
	return l
}

func (l *ledger) ack(r ferry.SendResult, body string) {
	now := time.Now()
	l.mu.Lock()
	l.acked[r.Queue.Queue][r.Offset] = record{body, now}
	l.times[r.Queue.Queue] = append(l.times[r.Queue.Queue], now)
	l.mu.Unlock()
}

func (l *ledger) handler() ferry.Handler {
	return ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		now := time.Now()
		l.mu.Lock()
		if _, ok := l.handled[m.Queue][m.Offset]; ok {
			l.redo++
		} else {
			l.handled[m.Queue][m.Offset] = record{string(m.Body), now}
		}
		l.htimes[m.Queue] = append(l.htimes[m.Queue], now)
		l.mu.Unlock()
		select {
		case l.wake <- struct{}{}:
		default:
		}
		return nil
	})
}

// firstAfter returns, per queue, how long after t the first time in ts
// came (-1 if none yet).
func firstAfter(ts [][]time.Time, t time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for q, qs := range ts {
		out[q] = -1
		for _, at := range qs {
			if at.After(t) && (out[q] < 0 || at.Sub(t) < out[q]) {
				out[q] = at.Sub(t)
			}
		}
	}
	return out
}

// resumed reports the per-queue delays after t of the next
// acknowledgement and the next handling, and whether every queue had both.
func (l *ledger) resumed(t time.Time) (sends, handles []time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sends, handles = firstAfter(l.times, t), firstAfter(l.htimes, t)
	ok = !slices.Contains(sends, -1) && !slices.Contains(handles, -1)
	return sends, handles, ok
}

func rounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}

// TestNodeFailure runs a ferry.Broker over natsstore on a 3-node cluster
// of server processes (this binary re-executed), R3, while producers
// send and a group of two consumers handles: it SIGKILLs the leader of a
// queue's stream, restarts it and waits until it caught up, then the same
// with the leader of the cursors bucket. Every acknowledged message is in
// its queue at its acknowledged offset, the offsets of each queue are
// contiguous, and the group handled every acknowledged message; the
// stalls (kill to the next acknowledgement and the next handling on each
// queue) are logged.
func TestNodeFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: server processes, Raft elections")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Second)
	defer cancel()
	began := time.Now()
	c := startProcCluster(t, ctx)
	t.Logf("cluster of 3 processes up in %v", time.Since(began).Round(10*time.Millisecond))

	const prefix, queues, producers = "nf", 4, 3
	opts := []natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithReplicas(3)}
	type member struct {
		st *natsstore.Store
		co *natsstore.Coordinator
		b  *ferry.Broker
	}
	var warns lines // the brokers' warnings: a lost lease, say
	newMember := func() member {
		js, err := jetstream.New(c.connect(t))
		require.NoError(t, err)
		var m member
		m.st, err = natsstore.Open(ctx, js, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.st.Close() })
		m.co, err = natsstore.NewCoordinator(ctx, js, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.co.Close() })
		m.b, err = ferry.NewBroker(ferry.WithStorage(m.st), ferry.WithCursorStore(m.st), ferry.WithCoordinator(m.co),
			ferry.WithLogger(slog.New(slog.NewTextHandler(&warns, &slog.HandlerOptions{Level: slog.LevelWarn}))))
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.b.Close() })
		return m
	}
	m1, m2 := newMember(), newMember()
	defer func() {
		for _, w := range warns.get() {
			t.Log("broker: " + w)
		}
	}()
	meta := ferry.TopicMeta{Name: "orders", Queues: queues}
	require.NoError(t, m1.b.CreateTopic(ctx, meta))
	require.NoError(t, m2.b.CreateTopic(ctx, meta))

	l := newLedger(queues)
	var consumers []*ferry.Consumer
	for i, m := range []member{m1, m2} {
		cons, err := m.b.NewConsumer("billing", "orders", l.handler(), ferry.WithMemberID(fmt.Sprintf("m%d", i+1)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cons.Close() })
		require.NoError(t, cons.Start(ctx))
		consumers = append(consumers, cons)
	}
	awaitCond(t, ctx, "two consumers split the queues", func() (bool, string) {
		a, b := len(consumers[0].Assigned()), len(consumers[1].Assigned())
		return a == 2 && b == 2, fmt.Sprintf("assigned %d and %d", a, b)
	})

	// Producers send keyed messages until stop, every 5 ms each.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for i := range producers {
		p, err := m1.b.NewProducer()
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		wg.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				b := fmt.Sprintf("p%d-%d", i, n)
				sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
				r, err := p.Send(sctx, &ferry.Message{Topic: "orders", Key: b, Body: []byte(b)})
				scancel()
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				l.ack(r, b)
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

	js, err := jetstream.New(c.connect(t))
	require.NoError(t, err)
	leaderOf := func(stream string) string {
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
		return leader
	}
	// crash SIGKILLs the leader of stream while the traffic runs, waits
	// until every queue takes and hands out messages again, restarts the
	// node and waits until it caught up.
	crash := func(what, stream string) {
		t.Helper()
		awaitCond(t, ctx, "traffic before the "+what+" crash", func() (bool, string) {
			_, _, ok := l.resumed(time.Now().Add(-time.Second))
			return ok, "not every queue acknowledged and handled within the last second"
		})
		name := leaderOf(stream)
		p := c.byName(name)
		p.kill()
		killed := time.Now()
		t.Logf("%s: SIGKILLed %s, the leader of %s", what, name, stream)
		var sends, handles []time.Duration
		wctx, wcancel := context.WithTimeout(ctx, 40*time.Second)
		defer wcancel()
		awaitCond(t, wctx, what+": service resumes on every queue", func() (bool, string) {
			var ok bool
			sends, handles, ok = l.resumed(killed)
			return ok, fmt.Sprintf("next ack per queue %v, next handling %v", sends, handles)
		})
		t.Logf("%s: next acknowledgement per queue after %v, next handling after %v; new leader %s",
			what, rounded(sends), rounded(handles), leaderOf(stream))
		p.start(t)
		p.awaitPort(t, ctx)
		restarted := time.Now()
		awaitCond(t, wctx, what+": "+name+" catches up", func() (bool, string) { return caughtUp(ctx, js, name) })
		t.Logf("%s: %s restarted %v after its kill, every stream current with no lag %v later",
			what, name, restarted.Sub(killed).Round(10*time.Millisecond), time.Since(restarted).Round(10*time.Millisecond))
	}
	crash("stream leader", prefix+"_orders_0")
	crash("KV leader", "KV_"+prefix+"_cursors")

	// Keep sending a little after the last catch-up, then stop.
	awaitCond(t, ctx, "traffic after the crashes", func() (bool, string) {
		_, _, ok := l.resumed(time.Now().Add(-time.Second))
		return ok, "not every queue acknowledged and handled within the last second"
	})
	stopProducers()
	if err, _ := firstErr.Load().(error); err != nil {
		t.Errorf("%d sends failed, the first: %v", failed.Load(), err)
	}

	// The group handles every acknowledged message.
	hctx, hcancel := context.WithTimeout(ctx, 30*time.Second)
	defer hcancel()
	awaitCond(t, hctx, "every acknowledged message handled", func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		missing := 0
		for q := range queues {
			for off := range l.acked[q] {
				if _, ok := l.handled[q][off]; !ok {
					missing++
				}
			}
		}
		return missing == 0, fmt.Sprintf("%d acknowledged messages not handled", missing)
	})

	// Read every queue back through a Store of its own.
	js2, err := jetstream.New(c.connect(t))
	require.NoError(t, err)
	st, err := natsstore.Open(ctx, js2, opts...)
	require.NoError(t, err)
	defer st.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	total, unacked := 0, 0
	bodies := map[string]int{}
	for q := range queues {
		fq, err := st.OpenQueue(ctx, meta, q)
		require.NoError(t, err)
		oldest, next := fq.Offsets()
		require.Equal(t, int64(0), oldest, "queue %d", q)
		dst := make([]*ferry.EnhancedMessage, 256)
		for off := int64(0); off < next; {
			n, err := fq.Read(ctx, off, dst)
			require.NoError(t, err, "queue %d offset %d", q, off)
			require.Positive(t, n, "queue %d offset %d", q, off)
			for _, m := range dst[:n] {
				require.Equal(t, off, m.Offset, "queue %d: offsets contiguous", q)
				bodies[string(m.Body)]++
				if a, ok := l.acked[q][off]; ok {
					require.Equal(t, a.body, string(m.Body), "queue %d offset %d", q, off)
					require.Equal(t, a.body, l.handled[q][off].body, "queue %d offset %d handled", q, off)
				} else {
					unacked++
				}
				off++
			}
		}
		for off := range l.acked[q] {
			require.Less(t, off, next, "queue %d: acknowledged offset %d beyond the end", q, off)
		}
		total += len(l.acked[q])
		require.NoError(t, fq.Close())
	}
	dups := 0
	for _, n := range bodies {
		dups += n - 1
	}
	require.Zero(t, dups, "messages stored twice")
	t.Logf("%d messages acknowledged, all at their offsets and handled (%d handlings again); %d stored without an acknowledgement; %d failed sends; took %v",
		total, l.redo, unacked, failed.Load(), time.Since(began).Round(100*time.Millisecond))
}
