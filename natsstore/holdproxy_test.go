package natsstore_test

import (
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// holdProxy forwards loopback TCP connections to a server. Held, it
// keeps what passes, in order, and delivers it when healed, as a
// partition does to TCP: the bytes wait in the sender's buffers and
// retransmissions until the path is back, and no side sees the
// connection fail (NATS pings every two minutes). So requests a client
// gave up on during a partition land after it heals, in the order they
// were sent.
type holdProxy struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	cond   *sync.Cond // signalled on every change under mu
	held   bool
	closed bool
	conns  []net.Conn
}

func newHoldProxy(t *testing.T, target string) *holdProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &holdProxy{l: l, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *holdProxy) url() string { return "nats://" + p.l.Addr().String() }

// hold starts keeping what passes; heal delivers it and lets traffic
// through again.
func (p *holdProxy) hold() { p.set(true) }
func (p *holdProxy) heal() { p.set(false) }

func (p *holdProxy) set(held bool) {
	p.mu.Lock()
	p.held = held
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *holdProxy) accept() {
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
		p.link(s, c)
		p.link(c, s)
	}
}

// link copies src to dst through a queue that is not written out while
// the proxy is held.
func (p *holdProxy) link(dst, src net.Conn) {
	var queue [][]byte // guarded by p.mu
	eof := false       // guarded by p.mu
	p.wg.Go(func() {
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			p.mu.Lock()
			if n > 0 {
				queue = append(queue, buf[:n])
			}
			if err != nil {
				eof = true
			}
			p.cond.Broadcast()
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() {
		for {
			p.mu.Lock()
			for !p.closed && (p.held || (len(queue) == 0 && !eof)) {
				p.cond.Wait()
			}
			if p.closed || len(queue) == 0 { // closed, or src ended and all is written
				p.mu.Unlock()
				dst.Close()
				return
			}
			out := queue
			queue = nil
			p.mu.Unlock()
			for _, b := range out {
				if _, err := dst.Write(b); err != nil {
					src.Close()
					return
				}
			}
		}
	})
}

func (p *holdProxy) close() {
	p.l.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}
