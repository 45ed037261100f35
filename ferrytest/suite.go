package ferrytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// DefaultTimeout is the watchdog's default: how long one subtest of a
// suite may run before it is reported as hung.
const DefaultTimeout = 10 * time.Second

// Features says what an implementation under test legitimately leaves out.
// The zero value asks for the least: not persistent, retention at least
// bounded, no back-pressure.
type Features struct {
	// Persistent: what is written survives Close and a reopen of the same
	// location (the dir passed to the opener). TestStorage and
	// TestCursorStore then check that topics, messages and cursors come
	// back; otherwise they only check that reopening works.
	Persistent bool
	// RetentionExact: the queue drops exactly the oldest messages that
	// break a bound of its [ferry.Retention] (messages, bytes, age) and no
	// more, as the memory queue does. Otherwise (a store that drops whole
	// segments, say) the suite only checks that a queue keeps at least
	// what its bounds allow, that the oldest offset never moves back, and
	// that what it reports as retained can be read.
	RetentionExact bool
	// Block: the queue supports [ferry.Block] overflow, implementing
	// [ferry.TryWriter] and [ferry.Releaser]; the suite then checks
	// back-pressure.
	Block bool
	// TokensPersist: a [ferry.FencedCursorStore]'s fencing tokens survive
	// a reopen, as a store shared by processes needs (their coordinator's
	// tokens outlive any one of them). A store owned by one process whose
	// coordinator starts its tokens again with it (filestore) keeps them
	// in memory instead, and TestCursorStore then only checks that a
	// reopened store fences again.
	TokensPersist bool
	// Timeout bounds each subtest (see the package doc on the watchdog).
	// Zero means [DefaultTimeout].
	Timeout time.Duration
}

func (f Features) timeout() time.Duration {
	if f.Timeout > 0 {
		return f.Timeout
	}
	return DefaultTimeout
}

// watchdog guards one subtest. ctx is cancelled when the subtest ends or
// hangs; the closers it holds are closed when it hangs.
type watchdog struct {
	t       *testing.T
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration

	mu      sync.Mutex // guards timer, done, closers and kill
	timer   *time.Timer
	done    bool
	closers []io.Closer
	kill    *time.Timer
}

// run runs body as subtest name under a watchdog.
func run(t *testing.T, f Features, name string, body func(t *testing.T, w *watchdog)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		w := &watchdog{t: t, timeout: f.timeout()}
		w.ctx, w.cancel = context.WithCancel(context.Background())
		w.mu.Lock()
		w.timer = time.AfterFunc(w.timeout, w.expire)
		w.mu.Unlock()
		defer func() {
			w.mu.Lock()
			w.timer.Stop()
			w.done = true
			if w.kill != nil {
				w.kill.Stop()
			}
			w.mu.Unlock()
			w.cancel()
		}()
		body(t, w)
	})
}

// progress restarts the watchdog's clock, for a subtest that works
// through many cases.
func (w *watchdog) progress() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done && w.kill == nil {
		w.timer.Reset(w.timeout)
	}
}

// closeOnHang registers c to be closed if the subtest hangs, to unblock it.
func (w *watchdog) closeOnHang(c io.Closer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closers = append(w.closers, c)
}

// expire reports a hung subtest, cancels its context and closes its
// instances; if the subtest still does not return within another timeout,
// it panics, which ends the test binary with a clear message.
func (w *watchdog) expire() {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return
	}
	w.t.Errorf("ferrytest: %s made no progress for %v (hung?): cancelling its context and closing the instance under test; goroutines:\n%s",
		w.t.Name(), w.timeout, stacks())
	closers := w.closers
	name, timeout := w.t.Name(), w.timeout
	w.kill = time.AfterFunc(timeout, func() {
		w.mu.Lock()
		done := w.done
		w.mu.Unlock()
		if !done {
			panic(fmt.Sprintf("ferrytest: %s still hung %v after its context was cancelled and its instance closed; goroutines:\n%s", name, timeout, stacks()))
		}
	})
	w.mu.Unlock()
	w.cancel()
	for _, c := range closers {
		_ = c.Close()
	}
}

func stacks() []byte {
	buf := make([]byte, 1<<20)
	return buf[:runtime.Stack(buf, true)]
}

// wantErr fails t unless errors.Is(err, target).
func wantErr(t testing.TB, err, target error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got no error, want %v", what, target)
	}
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %q, want one matching %v (errors.Is)", what, err, target)
	}
}

// must fails t if err is not nil.
func must(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: unexpected error: %v", what, err)
	}
}

// result is what a call run in a goroutine returned.
type result struct {
	n   int64
	err error
}

// sameMessage reports how got differs from want, or "" if it does not:
// every field is compared, times with Equal, nil and empty headers and
// bodies alike.
func sameMessage(got, want *ferry.EnhancedMessage) string {
	switch {
	case got == nil:
		return "nil message"
	case got.Topic != want.Topic:
		return fmt.Sprintf("Topic %q, want %q", got.Topic, want.Topic)
	case got.Key != want.Key:
		return fmt.Sprintf("Key %q, want %q", got.Key, want.Key)
	case got.Tag != want.Tag:
		return fmt.Sprintf("Tag %q, want %q", got.Tag, want.Tag)
	case !maps.Equal(got.Headers, want.Headers):
		return fmt.Sprintf("Headers %v, want %v", got.Headers, want.Headers)
	case !bytes.Equal(got.Body, want.Body):
		return fmt.Sprintf("Body %q, want %q", got.Body, want.Body)
	case got.ID != want.ID:
		return fmt.Sprintf("ID %s, want %s", got.ID, want.ID)
	case got.BornUnixNano != want.BornUnixNano:
		return fmt.Sprintf("BornTime %v, want %v", got.BornTime(), want.BornTime())
	case got.BornHost() != want.BornHost():
		return fmt.Sprintf("BornHost %q, want %q", got.BornHost(), want.BornHost())
	case got.ProducerName() != want.ProducerName():
		return fmt.Sprintf("ProducerName %q, want %q", got.ProducerName(), want.ProducerName())
	case got.Queue != want.Queue:
		return fmt.Sprintf("Queue %d, want %d", got.Queue, want.Queue)
	case got.Offset != want.Offset:
		return fmt.Sprintf("Offset %d, want %d", got.Offset, want.Offset)
	case got.StoreUnixNano != want.StoreUnixNano:
		return fmt.Sprintf("StoreTime %v, want %v", got.StoreTime(), want.StoreTime())
	}
	return ""
}
