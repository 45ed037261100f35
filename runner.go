package ferry

import (
	"sync"
	"time"
)

// runnerPool runs short tasks (a parked fetch loop's turn, with the
// handlers it runs inline) on goroutines that outlive them: a task goes
// to a runner waiting for one, or starts a runner, which waits for the
// next task for up to runnerIdle. A new goroutine per task would cost
// its start and, once the handler's calls deepen its stack, a stack
// copy; a runner grows its stack once.
type runnerPool struct {
	tasks  chan func() // unbuffered: a send goes through only to a waiting runner
	quit   chan struct{}
	mu     sync.Mutex // guards closed, and orders wg.Add before close's Wait
	wg     sync.WaitGroup
	closed bool
}

// runnerIdle is how long an idle runner waits for a task before it ends.
const runnerIdle = time.Second

func newRunnerPool() *runnerPool {
	return &runnerPool{tasks: make(chan func()), quit: make(chan struct{})}
}

// run runs f on a runner. It does not block (it may be called with a
// queue's lock held, see readWaiter).
func (p *runnerPool) run(f func()) {
	select {
	case p.tasks <- f:
		return
	default:
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		go f() // the broker closed: its consumers' last turns still run
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go p.runner(f)
}

func (p *runnerPool) runner(f func()) {
	defer p.wg.Done()
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		f()
		f = nil
		idle.Reset(runnerIdle)
		select {
		case f = <-p.tasks:
		case <-idle.C:
			return
		case <-p.quit:
			return
		}
	}
}

// close ends the idle runners and waits for every runner to end.
func (p *runnerPool) close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
