package ferry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrHandlerTimeout is the failure of a handler call that ran past its
// time limit (see [WithHandlerTimeout]): its context's cause, and the
// error the attempt counts, whatever the handler returned.
var ErrHandlerTimeout = errors.New("handler timed out")

// WithHandlerTimeout limits each handler call to d (push consumers
// only): the handler's context carries the deadline and is cancelled
// with [ErrHandlerTimeout] as its cause ([context.Cause]) when it passes.
// A call that returns after its deadline has failed, whatever it returned:
// the message is retried, then dead-lettered, as after any failure. A
// handler that ignores its context cannot be stopped: the worker waits
// for it to return, its queue's slot stays taken meanwhile, and a release
// of the queue waits for it up to [WithDrainTimeout]. Long work says
// "still working" with [InProgress], which moves the deadline on. Zero,
// the default, sets no limit; a negative d is [ErrInvalidOption].
func WithHandlerTimeout(d time.Duration) ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.handlerTimeout = d })
}

// InProgress tells the consumer that the handler whose context ctx is
// still works on its message (JetStream's InProgress, RocketMQ's
// consume-timeout extension): the call's deadline moves to a full
// [WithHandlerTimeout] from now. The queue's lease does not depend on
// the handler (the member's session keeps it while the process runs), so
// there is nothing else to keep alive; but if the lease was lost or its
// queue is being given up, the work cannot finish usefully, and
// InProgress says so: an error wrapping the handler context's cause
// ([ErrHandlerTimeout] once the deadline passed; the queue's loss or
// release otherwise). Outside a handler, or in one without a time limit,
// it returns nil and does nothing more than check ctx.
func InProgress(ctx context.Context) error {
	if ctx == nil {
		return &Error{Op: "in progress", Err: fmt.Errorf("%w: nil context", ErrInvalidOption)}
	}
	if tc, ok := ctx.Value(timedKey{}).(*timedCtx); ok {
		if err := tc.extend(); err != nil {
			return &Error{Op: "in progress", Err: err}
		}
		return nil
	}
	if ctx.Err() != nil {
		return &Error{Op: "in progress", Err: context.Cause(ctx)}
	}
	return nil
}

type timedKey struct{}

// timedCtx is a handler call's context under a time limit: a child of
// the call's context, cancelled with ErrHandlerTimeout by a timer that
// InProgress resets.
type timedCtx struct {
	context.Context
	cancel context.CancelCauseFunc
	limit  time.Duration
	mu     sync.Mutex
	dl     time.Time
	timer  *time.Timer
	passed bool // the deadline passed
}

func newTimedCtx(parent context.Context, limit time.Duration) *timedCtx {
	ctx, cancel := context.WithCancelCause(parent)
	tc := &timedCtx{Context: ctx, cancel: cancel, limit: limit, dl: time.Now().Add(limit)}
	tc.timer = time.AfterFunc(limit, tc.expire)
	return tc
}

func (tc *timedCtx) expire() {
	tc.mu.Lock()
	if time.Now().Before(tc.dl) { // moved on meanwhile
		tc.timer.Reset(time.Until(tc.dl))
		tc.mu.Unlock()
		return
	}
	tc.passed = true
	tc.mu.Unlock()
	tc.cancel(ErrHandlerTimeout)
}

// Deadline is the call's deadline as it stands: InProgress moves it.
func (tc *timedCtx) Deadline() (time.Time, bool) {
	tc.mu.Lock()
	dl := tc.dl
	tc.mu.Unlock()
	if pd, ok := tc.Context.Deadline(); ok && pd.Before(dl) {
		return pd, true
	}
	return dl, true
}

func (tc *timedCtx) Value(key any) any {
	if key == (timedKey{}) {
		return tc
	}
	return tc.Context.Value(key)
}

// extend moves the deadline to a full limit from now, unless the context
// ended already (its cause).
func (tc *timedCtx) extend() error {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.Err() != nil {
		return context.Cause(tc)
	}
	tc.dl = time.Now().Add(tc.limit)
	tc.timer.Reset(tc.limit)
	return nil
}

// end stops the timer once the call returned, and reports whether the
// deadline had passed.
func (tc *timedCtx) end() bool {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	tc.timer.Stop()
	passed := tc.passed || !time.Now().Before(tc.dl)
	tc.cancel(context.Canceled)
	return passed
}
