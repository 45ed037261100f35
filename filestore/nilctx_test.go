package filestore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// A read-only store, which the conformance suites do not run, refuses a
// nil context in every method that takes one, as the suites check of
// Store; never a panic.
func TestReadOnlyNilContext(t *testing.T) {
	dir := t.TempDir()
	st := open(t, dir)
	meta := ferry.TopicMeta{Name: "t", Queues: 1}
	require.NoError(t, st.SaveTopic(t.Context(), meta))
	ro := openRO(t, dir)
	q, err := ro.OpenQueue(t.Context(), meta, 0)
	require.NoError(t, err)
	dst := make([]*ferry.EnhancedMessage, 1)
	for name, call := range map[string]func(ctx context.Context) error{
		"Topics":       func(ctx context.Context) error { _, err := ro.Topics(ctx); return err },
		"Topic":        func(ctx context.Context) error { _, err := ro.Topic(ctx, "t"); return err },
		"SaveTopic":    func(ctx context.Context) error { return ro.SaveTopic(ctx, meta) },
		"CreateTopic":  func(ctx context.Context) error { return ro.CreateTopic(ctx, meta) },
		"OpenQueue":    func(ctx context.Context) error { _, err := ro.OpenQueue(ctx, meta, 0); return err },
		"Segments":     func(ctx context.Context) error { _, err := ro.Segments(ctx, "t", 0); return err },
		"Load":         func(ctx context.Context) error { _, err := ro.Load(ctx, "t", "g", 1); return err },
		"Cursors":      func(ctx context.Context) error { _, err := ro.Cursors(ctx, "t", 1); return err },
		"Commit":       func(ctx context.Context) error { return ro.Commit(ctx, "t", "g", 0, 1) },
		"CommitFenced": func(ctx context.Context) error { return ro.CommitFenced(ctx, "t", "g", 0, 1, 1) },
		"Forget":       func(ctx context.Context) error { return ro.Forget(ctx, "t", "g") },
		"queue Write":  func(ctx context.Context) error { _, err := q.Write(ctx, nil); return err },
		"queue Read":   func(ctx context.Context) error { _, err := q.Read(ctx, 0, dst); return err },
	} {
		var err error
		require.NotPanics(t, func() { err = call(nil) }, name)
		require.ErrorIs(t, err, ferry.ErrInvalidOption, name)
	}
}
