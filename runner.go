package ferry

import (
	"runtime"
	"sync"
	"time"
)

// runnerPool runs short tasks (a parked fetch loop's turn, with the
// handlers it runs inline) on goroutines that outlive them. A task goes
// to the runner that went idle last; with none idle, it starts a runner
// while fewer than maxRunners run, and waits in a queue otherwise, which
// runners drain before they go idle. So a burst of wake-ups (a write to
// each of 10,000 idle topics, faster than their handlers run) queues
// tasks, not goroutines; and a runner grows its stack once, where a new
// goroutine per task would pay its start and a stack copy each time.
//
// A task may block (a handler that waits, say). So that queued tasks
// never wait on it for long, a watchdog starts one more runner, beyond
// maxRunners, whenever tasks have waited starveAfter while no runner
// took one. Idle runners wait on channels of their own; one timer per
// pool retires those idle for runnerIdle.
type runnerPool struct {
	mu       sync.Mutex // guards every field below
	idle     []*runner  // the last is the one that went idle last
	queue    fifo[task]
	running  int    // runners started and not ended
	progress uint64 // tasks taken from the queue
	watched  uint64 // progress when the watchdog last looked
	armed    bool   // sweep is set
	watching bool   // watchdog is set
	sweep    *time.Timer
	watchdog *time.Timer
	closed   bool
	wg       sync.WaitGroup // the runners
}

// task is what a runner runs (a queueRun: its fetch loop's turn).
type task interface{ runTask() }

// taskFunc is a function as a task.
type taskFunc func()

func (f taskFunc) runTask() { f() }

// runner is an idle runner's mailbox: it gets its next task, or nil to end.
type runner struct {
	tasks chan task // capacity 1
	since time.Time // when it went idle
}

const (
	// runnerIdle is how long an idle runner waits for a task before it
	// ends, and maxIdleRunners how many wait at most.
	runnerIdle     = time.Second
	maxIdleRunners = 64
	// starveAfter is how long queued tasks wait, with no runner taking
	// one, before the watchdog starts another runner.
	starveAfter = 2 * time.Millisecond
)

// maxRunners bounds the runners started for tasks (the watchdog may
// start more): tasks mostly use the CPU.
var maxRunners = 4 * runtime.GOMAXPROCS(0)

func newRunnerPool() *runnerPool {
	p := &runnerPool{}
	p.sweep = time.AfterFunc(time.Hour, p.retire)
	p.sweep.Stop()
	p.watchdog = time.AfterFunc(time.Hour, p.watch)
	p.watchdog.Stop()
	return p
}

// run runs f on a runner. It does not block (it may be called with a
// queue's lock held, see readWaiter).
func (p *runnerPool) run(f task) {
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
		go f.runTask() // the broker closed: its consumers' last turns still run
		return
	}
	if p.running >= maxRunners {
		p.queue.push(f)
		if !p.watching {
			p.watching = true
			p.watched = p.progress
			p.watchdog.Reset(starveAfter)
		}
		p.mu.Unlock()
		return
	}
	p.startLocked(f)
	p.mu.Unlock()
}

// startLocked starts a runner with f. p.mu held.
func (p *runnerPool) startLocked(f task) {
	p.running++
	p.wg.Add(1)
	go p.loop(&runner{tasks: make(chan task, 1)}, f)
}

// loop runs tasks until it is told to end.
func (p *runnerPool) loop(w *runner, f task) {
	defer p.wg.Done()
	for f != nil {
		f.runTask()
		var parked bool
		if f, parked = p.next(w); f == nil && parked {
			f = <-w.tasks
		}
	}
}

// next returns a queued task for w, or lists w as idle (parked) or ends
// it (neither): the pool closed, or enough are idle.
func (p *runnerPool) next(w *runner) (f task, parked bool) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queue.len() > 0 {
		p.progress++
		return p.queue.pop(), false
	}
	if p.closed || len(p.idle) >= maxIdleRunners {
		p.running--
		return nil, false
	}
	w.since = now
	p.idle = append(p.idle, w)
	if !p.armed {
		p.armed = true
		p.sweep.Reset(runnerIdle)
	}
	return nil, true
}

// watch is the watchdog: with tasks queued and none taken since it last
// looked, it starts a runner.
func (p *runnerPool) watch() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.queue.len() == 0 {
		p.watching = false
		return
	}
	if p.progress == p.watched {
		p.progress++
		p.startLocked(p.queue.pop())
	}
	p.watched = p.progress
	p.watchdog.Reset(starveAfter)
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
	p.running -= k
	n := copy(p.idle, p.idle[k:])
	clear(p.idle[n:])
	p.idle = p.idle[:n]
	if n == 0 {
		p.armed = false
		return
	}
	p.sweep.Reset(p.idle[0].since.Sub(cutoff))
}

// close ends the idle runners and waits for every runner to end; tasks
// still queued (none, once every consumer closed) get goroutines of their
// own.
func (p *runnerPool) close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.sweep.Stop()
		p.watchdog.Stop()
		for _, w := range p.idle {
			w.tasks <- nil
		}
		p.running -= len(p.idle)
		p.idle = nil
		for p.queue.len() > 0 {
			go p.queue.pop().runTask()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}
