package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ferrymq/ferry"
)

// The NilContext subtests of the suites: a nil context is bad input to
// every seam method that takes one, an error wrapping
// [ferry.ErrInvalidOption] that changes nothing, never a panic.

// checkContext returns an error wrapping [ferry.ErrInvalidOption] for a
// nil ctx: the fakes refuse one at the top of every method that takes a
// context, before any fault or record, as the seams' contracts ask.
func checkContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)
	}
	return nil
}

// wantNilContext fails t unless call, given a nil context, returns an
// error wrapping ferry.ErrInvalidOption without panicking.
func wantNilContext(t *testing.T, what string, call func(ctx context.Context) error) {
	t.Helper()
	var err error
	if p := func() (p any) {
		defer func() { p = recover() }()
		err = call(nil)
		return nil
	}(); p != nil {
		t.Fatalf("%s with a nil context panicked: %v", what, p)
	}
	wantErr(t, err, ferry.ErrInvalidOption, what+" with a nil context")
}

func (s *queueSuite) nilContext(t *testing.T, w *watchdog) {
	q := s.open(t, w, ferry.Retention{})
	write(t, w, q, newMessages(0, 1))
	dst := make([]*ferry.EnhancedMessage, 1)
	wantNilContext(t, "Write", func(ctx context.Context) error { _, err := q.Write(ctx, newMessages(1, 1)); return err })
	wantNilContext(t, "Read of a stored message", func(ctx context.Context) error { _, err := q.Read(ctx, 0, dst); return err })
	wantNilContext(t, "Read at the next offset", func(ctx context.Context) error { _, err := q.Read(ctx, 1, dst); return err })
	if oc, ok := q.(ferry.OffsetsContexter); ok {
		wantNilContext(t, "OffsetsContext", func(ctx context.Context) error { _, _, err := oc.OffsetsContext(ctx); return err })
	}
	wantOffsets(t, q, 0, 1)
}

func (s *storageSuite) nilContext(t *testing.T, w *watchdog) {
	st := s.openAt(t, w, t.TempDir())
	must(t, st.SaveTopic(w.ctx, metaA), "SaveTopic")
	wantNilContext(t, "SaveTopic", func(ctx context.Context) error { return st.SaveTopic(ctx, metaB) })
	wantNilContext(t, "Topics", func(ctx context.Context) error { _, err := st.Topics(ctx); return err })
	wantNilContext(t, "OpenQueue", func(ctx context.Context) error {
		q, err := st.OpenQueue(ctx, metaA, 0)
		if q != nil {
			_ = q.Close()
		}
		return err
	})
	if ss, ok := st.(ferry.SharedStorage); ok {
		wantNilContext(t, "CreateTopic", func(ctx context.Context) error { return ss.CreateTopic(ctx, metaB) })
		wantNilContext(t, "Topic", func(ctx context.Context) error { _, err := ss.Topic(ctx, metaA.Name); return err })
	}
	if td, ok := st.(ferry.TopicDeleter); ok {
		wantNilContext(t, "DeleteTopic", func(ctx context.Context) error { return td.DeleteTopic(ctx, metaA.Name) })
	}
	wantTopics(t, w, st, metaA)
}

func (s *cursorSuite) nilContext(t *testing.T, w *watchdog) {
	cs := s.openAt(t, w, t.TempDir())
	commit(t, w, cs, "orders", "billing", 0, 5)
	wantNilContext(t, "Load", func(ctx context.Context) error { _, err := cs.Load(ctx, "orders", "billing", 1); return err })
	wantNilContext(t, "Commit", func(ctx context.Context) error { return cs.Commit(ctx, "orders", "billing", 0, 7) })
	if fc, ok := cs.(ferry.FencedCursorStore); ok {
		wantNilContext(t, "CommitFenced", func(ctx context.Context) error { return fc.CommitFenced(ctx, "orders", "billing", 0, 7, 1) })
	}
	if cg, ok := cs.(ferry.CursorGroups); ok {
		wantNilContext(t, "Cursors", func(ctx context.Context) error { _, err := cg.Cursors(ctx, "orders", 1); return err })
		wantNilContext(t, "Forget", func(ctx context.Context) error { return cg.Forget(ctx, "orders", "billing") })
	}
	wantCursor(t, w, cs, "orders", "billing", 5)
}

func (s *coordSuite) nilContext(t *testing.T, w *watchdog) {
	c := s.openC(t, w)
	wantNilContext(t, "Join", func(ctx context.Context) error {
		sess, err := c.Join(ctx, gOrders, "ghost")
		if sess != nil {
			_ = sess.Leave(w.ctx)
		}
		return err
	})
	wantNilContext(t, "Members", func(ctx context.Context) error { _, err := c.Members(ctx, gOrders); return err })
	sess := joinC(t, w, c, gOrders, "m1")
	wantNilContext(t, "Lock", func(ctx context.Context) error {
		l, err := sess.Lock(ctx, 1)
		if l != nil {
			_ = l.Release(w.ctx)
		}
		return err
	})
	l := lockQ(t, w, sess, "m1", 0)
	wantNilContext(t, "Release", func(ctx context.Context) error { return l.Release(ctx) })
	wantNilContext(t, "Leave", func(ctx context.Context) error { return sess.Leave(ctx) })

	// Nothing changed: m1 is the only member, its session and lease live,
	// and the lock is still held.
	wantMembers(t, w, c, gOrders, "m1")
	select {
	case <-sess.Done():
		t.Fatal("the session ended after a Leave with a nil context")
	case <-l.Lost():
		t.Fatal("the lease was lost after a Release with a nil context")
	default:
	}
	other := joinC(t, w, c, gOrders, "m2")
	ctx, cancel := context.WithTimeout(w.ctx, blockedFor)
	defer cancel()
	if ol, err := other.Lock(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		if ol != nil {
			_ = ol.Release(w.ctx)
		}
		t.Fatalf("another session's Lock of queue 0 after a Release with a nil context: %v, want it to wait (the lock still held)", err)
	}
	must(t, l.Release(w.ctx), "Release")
	must(t, sess.Leave(w.ctx), "Leave")
	must(t, other.Leave(w.ctx), "Leave")
}
