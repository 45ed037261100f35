package ferry

import (
	"sync"
	"time"
)

// runnerPool runs short tasks (a parked fetch loop's turn, with the
// handlers it runs inline) on goroutines that outlive them: a task goes
// to the runner that went idle last, or starts a runner; a runner idle
// for runnerIdle ends. A new goroutine per task would cost its start
// and, once the handler's calls deepen its stack, a stack copy; a runner
// grows its stack once. Idle runners wait on channels of their own (no
// channel shared by all of them to contend on), and one timer per pool
// retires them.
type runnerPool struct {
	mu     sync.Mutex // guards every field below
	idle   []*runner  // the last is the one that went idle last
	armed  bool       // sweep is set
	sweep  *time.Timer
	closed bool
	wg     sync.WaitGroup // the runners
}

// runner is an idle runner's mailbox: it gets its next task, or nil to end.
type runner struct {
	tasks chan func() // capacity 1
	since time.Time   // when it went idle
}

// runnerIdle is how long an idle runner waits for a task before it ends.
const runnerIdle = time.Second

func newRunnerPool() *runnerPool {
	p := &runnerPool{}
	p.sweep = time.AfterFunc(time.Hour, p.retire)
	p.sweep.Stop()
	return p
}

// run runs f on a runner. It does not block (it may be called with a
// queue's lock held, see readWaiter).
func (p *runnerPool) run(f func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.tasks <- f // capacity 1, and it waits for this one task
		return
	}
	if p.closed {
		p.mu.Unlock()
		go f() // the broker closed: its consumers' last turns still run
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go p.loop(&runner{tasks: make(chan func(), 1)}, f)
}

// loop runs tasks until it is told to end.
func (p *runnerPool) loop(w *runner, f func()) {
	defer p.wg.Done()
	for f != nil {
		f()
		if !p.park(w) {
			return
		}
		f = <-w.tasks
	}
}

// park lists w as idle; false if the pool closed.
func (p *runnerPool) park(w *runner) bool {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	w.since = now
	p.idle = append(p.idle, w)
	if !p.armed {
		p.armed = true
		p.sweep.Reset(runnerIdle)
	}
	return true
}

// retire ends the runners idle for runnerIdle (the first ones listed).
func (p *runnerPool) retire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	cutoff := time.Now().Add(-runnerIdle)
	k := 0
	for k < len(p.idle) && !p.idle[k].since.After(cutoff) {
		p.idle[k].tasks <- nil
		k++
	}
	n := copy(p.idle, p.idle[k:])
	clear(p.idle[n:])
	p.idle = p.idle[:n]
	if n == 0 {
		p.armed = false
		return
	}
	p.sweep.Reset(p.idle[0].since.Sub(cutoff))
}

// close ends the idle runners and waits for every runner to end.
func (p *runnerPool) close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.sweep.Stop()
		for _, w := range p.idle {
			w.tasks <- nil
		}
		p.idle = nil
	}
	p.mu.Unlock()
	p.wg.Wait()
}
