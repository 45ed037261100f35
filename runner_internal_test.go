package ferry

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The pool reuses an idle runner, runs every task, ends runners idle for
// runnerIdle, and after close still runs a task (on a goroutine of its
// own) and leaves no runner behind.
func TestRunnerPool(t *testing.T) {
	p := newRunnerPool()
	idle := func() []*runner { p.mu.Lock(); defer p.mu.Unlock(); return append([]*runner(nil), p.idle...) }
	runWait := func() {
		done := make(chan struct{})
		p.run(taskFunc(func() { close(done) }))
		<-done
	}

	runWait()
	require.Eventually(t, func() bool { return len(idle()) == 1 }, time.Second, time.Millisecond)
	w := idle()[0]
	runWait()
	require.Eventually(t, func() bool { return len(idle()) == 1 }, time.Second, time.Millisecond)
	require.Same(t, w, idle()[0], "the idle runner took the task")

	var wg sync.WaitGroup
	ran := make(chan int, 100)
	for i := range 100 {
		wg.Add(1)
		p.run(taskFunc(func() { defer wg.Done(); ran <- i }))
	}
	wg.Wait()
	require.Len(t, ran, 100)

	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.idle) == 0 && !p.armed
	}, 3*runnerIdle, 10*time.Millisecond, "idle runners end")

	p.run(taskFunc(func() {}))
	p.close()
	p.close() // idempotent
	runWait()
}
