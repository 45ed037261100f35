package remote_test

import (
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// proxy forwards TCP connections to a backend. Once armed with a budget,
// it forwards that many more bytes from clients to the backend (or, armed
// with armReplies, from the backend to clients), summed over its
// connections, then cuts every connection: the server sees a request end
// in the middle, as if the client's machine died, and the client sees its
// connection die, as if the server's did.
type proxy struct {
	l       net.Listener
	backend string

	mu      sync.Mutex // guards conns, budget and cut
	conns   []net.Conn
	budget  int64 // bytes still forwarded once armed; -1 unarmed
	replies bool  // the budget counts the backend's bytes, not the clients'
	cut     chan struct{}
	wg      sync.WaitGroup
}

func newProxy(t *testing.T, backend string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{l: l, backend: backend, budget: -1, cut: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

// arm cuts the connections after n more bytes from the clients.
func (p *proxy) arm(n int64) {
	p.mu.Lock()
	p.budget, p.replies = n, false
	p.mu.Unlock()
}

// armReplies cuts the connections after n more bytes from the backend.
func (p *proxy) armReplies(n int64) {
	p.mu.Lock()
	p.budget, p.replies = n, true
	p.mu.Unlock()
}

// take returns how many of n bytes going one way (reply: from the
// backend) may pass, and whether to cut after them.
func (p *proxy) take(n int, reply bool) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.budget < 0 || p.replies != reply {
		return n, false
	}
	k := min(int64(n), p.budget)
	p.budget -= k
	return int(k), p.budget == 0
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.forward(c, b, false)
		go p.forward(b, c, true)
	}
}

// forward copies from to to within the budget, then closes to.
func (p *proxy) forward(from, to net.Conn, reply bool) {
	defer p.wg.Done()
	buf := make([]byte, 4096)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			k, cut := p.take(n, reply)
			if _, werr := to.Write(buf[:k]); werr != nil {
				break
			}
			if cut {
				p.cutAll()
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = to.Close()
}

// cutAll closes every connection and disarms.
func (p *proxy) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.budget = -1
}

func (p *proxy) close() {
	_ = p.l.Close()
	p.cutAll()
	p.wg.Wait()
}
