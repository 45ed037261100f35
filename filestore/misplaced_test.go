package filestore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

var misplacedMetas = []ferry.TopicMeta{
	{Name: "t", Queues: 2, Retention: corruptMeta.Retention},
	{Name: "u", Queues: 1, Retention: corruptMeta.Retention},
}

// misplacedBody is the same length in every queue, so that the segments
// of every queue have the same names and sizes.
func misplacedBody(topic string, queue, i int) string {
	return fmt.Sprintf("%s%d-body-%05d", topic, queue, i)
}

// fillQueues writes the same number of messages, in the same batches, to
// every queue of misplacedMetas in a store in dir, and commits a cursor.
func fillQueues(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	st, err := filestore.Open(dir, corruptOptions()...)
	require.NoError(t, err)
	for _, meta := range misplacedMetas {
		require.NoError(t, st.SaveTopic(ctx, meta))
		for qi := range meta.Queues {
			q, err := st.OpenQueue(ctx, meta, qi)
			require.NoError(t, err)
			for i := 0; i < 800; i += 4 {
				batch := make([]*ferry.EnhancedMessage, 4)
				for j := range batch {
					batch[j] = &ferry.EnhancedMessage{Message: ferry.Message{Topic: meta.Name, Body: []byte(misplacedBody(meta.Name, qi, i+j))}}
				}
				_, err := q.Write(ctx, batch)
				require.NoError(t, err)
			}
		}
	}
	require.NoError(t, st.Commit(ctx, "t", "g", 0, 7))
	require.NoError(t, st.Close())
}

func queueFiles(t *testing.T, dir, topic string, queue int, ext string) []string {
	t.Helper()
	fs, err := filepath.Glob(filepath.Join(dir, "topics", topic, fmt.Sprint(queue), "*"+ext))
	require.NoError(t, err)
	require.Greater(t, len(fs), 3)
	return fs
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o600))
}

// neverServed checks that no message of queue t[0] read from dir carries
// another queue's body: Open fails with ErrCorrupt (when open fails), or
// every read of the queue is its own message or ErrCorrupt.
func neverServed(t *testing.T, dir string, opts ...filestore.Option) (readErrs int, openErr error) {
	t.Helper()
	st, err := filestore.Open(dir, corruptOptions(opts...)...)
	if err != nil {
		require.ErrorIs(t, err, ferry.ErrCorrupt)
		return 0, err
	}
	defer st.Close()
	q, err := st.OpenQueue(context.Background(), misplacedMetas[0], 0)
	require.NoError(t, err)
	_, next := q.Offsets()
	dst := make([]*ferry.EnhancedMessage, 1)
	for off := range next {
		n, err := q.Read(context.Background(), off, dst)
		if err != nil {
			require.ErrorIs(t, err, ferry.ErrCorrupt)
			readErrs++
			continue
		}
		require.Equal(t, 1, n)
		require.Equal(t, misplacedBody("t", 0, int(off)), string(dst[0].Body), "offset %d", off)
	}
	return readErrs, nil
}

// TestMisplacedFiles copies segments, indexes and cursor files to
// another queue, topic or store: what was written for one is never served
// as another's. Each case says whether the copy is detected (ErrCorrupt),
// repaired (rebuilt) or lost.
func TestMisplacedFiles(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, dir, other string)
		check  func(t *testing.T, dir string)
	}{
		{
			name: "newest segment from another queue: detected at Open",
			damage: func(t *testing.T, dir, other string) {
				from, to := queueFiles(t, dir, "t", 1, ".log"), queueFiles(t, dir, "t", 0, ".log")
				copyFile(t, from[len(from)-1], to[len(to)-1])
			},
			check: func(t *testing.T, dir string) {
				_, err := neverServed(t, dir)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), "another queue")
			},
		},
		{
			name: "newest segment from another topic: detected at Open",
			damage: func(t *testing.T, dir, other string) {
				from, to := queueFiles(t, dir, "u", 0, ".log"), queueFiles(t, dir, "t", 0, ".log")
				copyFile(t, from[len(from)-1], to[len(to)-1])
			},
			check: func(t *testing.T, dir string) {
				_, err := neverServed(t, dir)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
			},
		},
		{
			name: "newest segment from another store: detected at Open",
			damage: func(t *testing.T, dir, other string) {
				from, to := queueFiles(t, other, "t", 0, ".log"), queueFiles(t, dir, "t", 0, ".log")
				copyFile(t, from[len(from)-1], to[len(to)-1])
			},
			check: func(t *testing.T, dir string) {
				_, err := neverServed(t, dir)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
			},
		},
		{
			name: "sealed segment and its index from another queue: detected on read, or at Open",
			damage: func(t *testing.T, dir, other string) {
				from, to := queueFiles(t, dir, "t", 1, ".log"), queueFiles(t, dir, "t", 0, ".log")
				copyFile(t, from[1], to[1])
				fi, ti := queueFiles(t, dir, "t", 1, ".index"), queueFiles(t, dir, "t", 0, ".index")
				copyFile(t, fi[1], ti[1])
			},
			check: func(t *testing.T, dir string) {
				reads, err := neverServed(t, dir)
				assert.True(t, err != nil || reads > 0, "detected")
				_, err = neverServed(t, dir, filestore.WithVerify())
				require.ErrorIs(t, err, ferry.ErrCorrupt)
			},
		},
		{
			name: "sealed segment from another store: detected on read, or at Open",
			damage: func(t *testing.T, dir, other string) {
				from, to := queueFiles(t, other, "t", 0, ".log"), queueFiles(t, dir, "t", 0, ".log")
				copyFile(t, from[0], to[0])
			},
			check: func(t *testing.T, dir string) {
				reads, err := neverServed(t, dir)
				assert.True(t, err != nil || reads > 0, "detected")
			},
		},
		{
			name: "index from another queue: repaired (rebuilt), nothing lost",
			damage: func(t *testing.T, dir, other string) {
				fi, ti := queueFiles(t, dir, "t", 1, ".index"), queueFiles(t, dir, "t", 0, ".index")
				copyFile(t, fi[0], ti[0])
			},
			check: func(t *testing.T, dir string) {
				st, err := filestore.Open(dir, corruptOptions()...)
				require.NoError(t, err)
				defer st.Close()
				assert.Len(t, st.Recovery().RebuiltIndexes, 1)
				require.NoError(t, st.Close())
				reads, err := neverServed(t, dir)
				require.NoError(t, err)
				assert.Zero(t, reads)
			},
		},
		{
			name: "index from another store: repaired (rebuilt), nothing lost",
			damage: func(t *testing.T, dir, other string) {
				fi, ti := queueFiles(t, other, "t", 0, ".index"), queueFiles(t, dir, "t", 0, ".index")
				copyFile(t, fi[1], ti[1])
			},
			check: func(t *testing.T, dir string) {
				st, err := filestore.Open(dir, corruptOptions()...)
				require.NoError(t, err)
				defer st.Close()
				assert.Len(t, st.Recovery().RebuiltIndexes, 1)
				require.NoError(t, st.Close())
				reads, err := neverServed(t, dir)
				require.NoError(t, err)
				assert.Zero(t, reads)
			},
		},
		{
			name: "cursor file from another store: detected at Open",
			damage: func(t *testing.T, dir, other string) {
				copyFile(t, filepath.Join(other, "cursors"), filepath.Join(dir, "cursors"))
			},
			check: func(t *testing.T, dir string) {
				_, err := filestore.Open(dir, corruptOptions()...)
				require.ErrorIs(t, err, ferry.ErrCorrupt)
				assert.Contains(t, err.Error(), "cursors")
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, other := t.TempDir(), t.TempDir()
			fillQueues(t, dir)
			fillQueues(t, other)
			c.damage(t, dir, other)
			c.check(t, dir)
		})
	}
}
