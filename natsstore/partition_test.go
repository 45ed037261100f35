package natsstore_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// proxy forwards loopback TCP connections to a server; while dropping,
// it silently discards what passes, as a partition does.
type proxy struct {
	l        net.Listener
	target   string
	dropping atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex // guards conns
	conns    []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{l: l, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c) })
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

func (p *proxy) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if p.dropping.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *proxy) close() {
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestPartition cuts a lock holder off (its connection goes through a
// proxy that starts dropping everything): its lease is lost, from its own
// timer, before another session's Lock of the queue returns; its session
// ends; a commit under its stale token is fenced.
func TestPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: waits for the TTL")
	}
	c := singleServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	prefix := "part"
	px := newProxy(t, c.servers[0].Addr().String())
	nc, err := nats.Connect("nats://"+px.l.Addr().String(), nats.MaxReconnects(-1))
	require.NoError(t, err)
	defer nc.Close()
	jsA, err := jetstream.New(nc)
	require.NoError(t, err)
	jsB := c.connect(t)

	opts := []natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithTTL(ttl), natsstore.WithOpTimeout(500 * time.Millisecond)}
	coA, err := natsstore.NewCoordinator(ctx, jsA, opts...)
	require.NoError(t, err)
	defer coA.Close()
	coB, err := natsstore.NewCoordinator(ctx, jsB, opts...)
	require.NoError(t, err)
	defer coB.Close()
	stA, err := natsstore.Open(ctx, jsA, opts...)
	require.NoError(t, err)
	defer stA.Close()
	stB, err := natsstore.Open(ctx, jsB, opts...)
	require.NoError(t, err)
	defer stB.Close()

	g := ferry.GroupKey{Scope: "billing", Topic: "orders"}
	a, err := coA.Join(ctx, g, "a")
	require.NoError(t, err)
	b, err := coB.Join(ctx, g, "b")
	require.NoError(t, err)
	la, err := a.Lock(ctx, 0)
	require.NoError(t, err)
	require.NoError(t, stA.CommitFenced(ctx, "orders", "billing", 0, 10, la.Token()))

	type got struct {
		l  ferry.Lease
		at time.Time
	}
	ch := make(chan got, 1)
	go func() {
		l, err := b.Lock(ctx, 0)
		if err != nil {
			ch <- got{}
			return
		}
		ch <- got{l, time.Now()}
	}()
	var lostAt time.Time
	lostCh := make(chan time.Time, 1)
	go func() {
		select {
		case <-la.Lost():
			lostCh <- time.Now()
		case <-ctx.Done():
			lostCh <- time.Time{}
		}
	}()

	cut := time.Now()
	px.dropping.Store(true)
	lostAt = <-lostCh
	require.False(t, lostAt.IsZero(), "the cut-off holder's lease was never lost")
	r := <-ch
	require.NotNil(t, r.l, "the other session never got the lock")
	t.Logf("cut off: lease lost after %v, taken by the other member after %v (TTL %v)",
		lostAt.Sub(cut).Round(10*time.Millisecond), r.at.Sub(cut).Round(10*time.Millisecond), ttl)
	require.True(t, lostAt.Before(r.at), "the lock was taken before the holder knew it lost it")
	require.Greater(t, r.l.Token(), la.Token())
	select {
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("the cut-off session never ended")
	}
	require.NoError(t, stB.CommitFenced(ctx, "orders", "billing", 0, 20, r.l.Token()))

	px.dropping.Store(false) // heal: the old holder's late commit is refused
	err = stA.CommitFenced(ctx, "orders", "billing", 0, 11, la.Token())
	for err != nil && !errorsIsFenced(err) && ctx.Err() == nil {
		err = stA.CommitFenced(ctx, "orders", "billing", 0, 11, la.Token()) // reconnecting
	}
	require.ErrorIs(t, err, ferry.ErrFenced)
	offs, err := stB.Load(ctx, "orders", "billing", 1)
	require.NoError(t, err)
	require.Equal(t, []int64{20}, offs)
}
