package ferrytest

import (
	"context"

	"github.com/ferrymq/ferry"
)

// commitCall is one commit through a store wrapped by wrapCursors.
type commitCall struct {
	topic, group string
	queue        int
	offset       int64
	token        uint64 // 0 for a plain Commit
	fenced       bool   // made through CommitFenced
}

// wrapCursors returns s with every commit made through around, which
// calls commit (the delegate's) and returns what it returns, observing or
// serializing the commit. The rule of [ferry.FencedCursorStore] holds by
// construction: the wrapper is a FencedCursorStore exactly when s is, and
// its CommitFenced goes through around too, so a consumer's fenced
// commits neither bypass the wrapper nor lose their token. Every wrapper
// of a cursor store in this package is made here; the suites check that
// the consumer's commits reach a fenced store fenced (see the
// unfenced-commit violation of ChurnModel), so a wrapper that dropped
// CommitFenced would fail them.
func wrapCursors(s ferry.CursorStore, around func(c commitCall, commit func() error) error) ferry.CursorStore {
	w := &wrappedCursors{CursorStore: s, around: around}
	if f, ok := s.(ferry.FencedCursorStore); ok {
		return &wrappedFencedCursors{wrappedCursors: w, f: f}
	}
	return w
}

type wrappedCursors struct {
	ferry.CursorStore
	around func(c commitCall, commit func() error) error
}

func (w *wrappedCursors) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	return w.around(commitCall{topic: topic, group: group, queue: queue, offset: offset}, func() error {
		return w.CursorStore.Commit(ctx, topic, group, queue, offset)
	})
}

type wrappedFencedCursors struct {
	*wrappedCursors
	f ferry.FencedCursorStore
}

var _ ferry.FencedCursorStore = (*wrappedFencedCursors)(nil)

func (w *wrappedFencedCursors) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	return w.around(commitCall{topic: topic, group: group, queue: queue, offset: offset, token: token, fenced: true}, func() error {
		return w.f.CommitFenced(ctx, topic, group, queue, offset, token)
	})
}
