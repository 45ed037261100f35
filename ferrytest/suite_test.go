package ferrytest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/stretchr/testify/require"
)

// A suite that passes everything proves nothing: each case below runs a
// suite over an implementation broken in one way, in a child process (a
// failing suite fails its test, and a hung one panics), and checks that
// the suite fails and says why.

const brokenEnv = "FERRYTEST_BROKEN"

type brokenCase struct {
	run  func(t *testing.T)
	want string // in the child's output; "" for the control, which must pass
}

var brokenCases = map[string]brokenCase{
	"control": {
		run:  func(t *testing.T) { ferrytest.TestQueue(t, ferrytest.Features{}, brokenQueueFactory("")) },
		want: "",
	},
	"read-ignores-ctx": {
		run: func(t *testing.T) {
			ferrytest.TestQueue(t, ferrytest.Features{Timeout: 200 * time.Millisecond}, brokenQueueFactory("read-ignores-ctx"))
		},
		want: "made no progress for 200ms",
	},
	"read-hangs": {
		run: func(t *testing.T) {
			ferrytest.TestQueue(t, ferrytest.Features{Timeout: 200 * time.Millisecond}, brokenQueueFactory("read-hangs"))
		},
		want: "still hung 200ms after its context was cancelled",
	},
	"write-not-atomic": {
		run: func(t *testing.T) {
			ferrytest.TestQueue(t, ferrytest.Features{}, brokenQueueFactory("write-not-atomic"))
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/InvalidBatch",
	},
	"drops-too-much": {
		run:  func(t *testing.T) { ferrytest.TestQueue(t, ferrytest.Features{}, brokenQueueFactory("drops-too-much")) },
		want: "dropped more than retention allows",
	},
	"keeps-too-much": {
		run: func(t *testing.T) {
			ferrytest.TestQueue(t, ferrytest.Features{RetentionExact: true}, brokenQueueFactory("keeps-too-much"))
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/Retention/Messages",
	},
	"wrong-sentinel": {
		run:  func(t *testing.T) { ferrytest.TestQueue(t, ferrytest.Features{}, brokenQueueFactory("wrong-sentinel")) },
		want: `want one matching offset out of range (errors.Is)`,
	},
	"close-twice-fails": {
		run: func(t *testing.T) {
			ferrytest.TestQueue(t, ferrytest.Features{}, brokenQueueFactory("close-twice-fails"))
		},
		want: "second Close: unexpected error",
	},
	"no-block-support": {
		run: func(t *testing.T) {
			ferrytest.TestQueue(t, ferrytest.Features{Block: true}, brokenQueueFactory("no-block-support"))
		},
		want: "does not implement ferry.TryWriter",
	},
	"topics-unsorted": {
		run: func(t *testing.T) {
			ferrytest.TestStorage(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.Storage {
				return unsortedStorage{ferry.NewMemoryStorage()}
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/Topics",
	},
	"storage-not-persistent": {
		run: func(t *testing.T) {
			ferrytest.TestStorage(t, ferrytest.Features{Persistent: true}, func(t *testing.T, dir string) ferry.Storage {
				return ferry.NewMemoryStorage()
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/Reopen",
	},
	"storage-queue-in-a-byte": {
		run: func(t *testing.T) {
			ferrytest.TestStorage(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.Storage {
				return byteQueueStorage{ferry.NewMemoryStorage()}
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/WideQueues",
	},
	"storage-names-truncated": {
		run: func(t *testing.T) {
			ferrytest.TestStorage(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.Storage {
				return truncatedStorage{ferry.NewMemoryStorage()}
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/SharedPrefixes",
	},
	"cursor-unset-zero": {
		run: func(t *testing.T) {
			ferrytest.TestCursorStore(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.CursorStore {
				return zeroCursorStore{ferry.NewMemoryCursorStore()}
			})
		},
		want: "Load(orders, billing, 3) = [0 0 0], want [-1 -1 -1]",
	},
	"cursor-not-persistent": {
		run: func(t *testing.T) {
			ferrytest.TestCursorStore(t, ferrytest.Features{Persistent: true}, func(t *testing.T, dir string) ferry.CursorStore {
				return ferry.NewMemoryCursorStore()
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/Reopen",
	},
	"cursor-names-truncated": {
		run: func(t *testing.T) {
			ferrytest.TestCursorStore(t, ferrytest.Features{Persistent: true}, func(t *testing.T, dir string) ferry.CursorStore {
				return truncatedCursorStore{sharedMemoryCursorStore(dir)}
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/SharedPrefixes",
	},
	"cursor-queue-in-a-byte": {
		run: func(t *testing.T) {
			ferrytest.TestCursorStore(t, ferrytest.Features{Persistent: true}, func(t *testing.T, dir string) ferry.CursorStore {
				return byteQueueCursorStore{sharedMemoryCursorStore(dir)}
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/WideQueues",
	},
	"cursor-forget-does-nothing": {
		run: func(t *testing.T) {
			ferrytest.TestCursorStore(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.CursorStore {
				return forgetfulCursorStore{ferry.NewMemoryCursorStore()}
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/Forget",
	},
	"cursor-fenced-ignores-token": {
		run: func(t *testing.T) {
			ferrytest.TestCursorStore(t, ferrytest.Features{}, func(t *testing.T, dir string) ferry.CursorStore {
				return unfencedCursorStore{ferry.NewMemoryCursorStore()}
			})
		},
		want: "with stale token 4: got no error, want fenced",
	},
	"nil-ctx-panics": {
		run:  func(t *testing.T) { ferrytest.TestQueue(t, ferrytest.Features{}, brokenQueueFactory("nil-ctx-panics")) },
		want: "Write with a nil context panicked",
	},
	"allocator-two-owners": {
		run: func(t *testing.T) {
			ferrytest.TestAllocator(t, func(t *testing.T) ferry.Allocator {
				return ferry.AllocatorFunc(func(g, self string, qs []ferry.QueueID, ms []string) []ferry.QueueID {
					out := ferry.AllocateAveragely().Allocate(g, self, qs, ms)
					if len(qs) > 0 && (len(out) == 0 || out[0] != qs[0]) {
						out = append(out, qs[0])
					}
					return out
				})
			})
		},
		want: "to both",
	},
	"allocator-panics": {
		run: func(t *testing.T) {
			ferrytest.TestAllocator(t, func(t *testing.T) ferry.Allocator {
				return ferry.AllocatorFunc(func(g, self string, qs []ferry.QueueID, ms []string) []ferry.QueueID {
					return qs[:1]
				})
			})
		},
		want: "panicked",
	},
	"allocator-unstable": {
		run: func(t *testing.T) {
			var calls atomic.Int64
			ferrytest.TestAllocator(t, func(t *testing.T) ferry.Allocator {
				return ferry.AllocatorFunc(func(g, self string, qs []ferry.QueueID, ms []string) []ferry.QueueID {
					rot := int(calls.Add(1)) % max(len(ms), 1)
					ms = append(slices.Clone(ms[rot:]), ms[:rot]...)
					return ferry.AllocateAveragely().Allocate(g, self, qs, ms)
				})
			})
		},
		want: "--- FAIL: TestSuitesCatchBrokenImplementations/SameAnswer",
	},
}

func TestSuitesCatchBrokenImplementations(t *testing.T) {
	if name := os.Getenv(brokenEnv); name != "" {
		brokenCases[name].run(t) // in the child: expected to fail
		return
	}
	for name, c := range brokenCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSuitesCatchBrokenImplementations$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if c.want == "" {
				require.NoError(t, err, "the control must pass:\n%s", out)
				return
			}
			require.Error(t, err, "the suite passed a queue broken by %s:\n%s", name, out)
			require.Contains(t, string(out), c.want)
		})
	}
}

// brokenQueue is a memory queue broken in the way mode says.
type brokenQueue struct {
	*ferry.MemoryQueue
	mode    string
	closing chan struct{}
	closed  atomic.Bool
}

func brokenQueueFactory(mode string) ferrytest.QueueFactory {
	return func(t *testing.T, meta ferry.TopicMeta, queue int) ferry.Queue {
		r := meta.Retention
		switch {
		case mode == "drops-too-much" && r.MaxMessages > 1:
			r.MaxMessages--
		case mode == "keeps-too-much" && r.MaxMessages > 0:
			r.MaxMessages++
		}
		q := &brokenQueue{
			MemoryQueue: ferry.NewMemoryQueue(ferry.QueueID{Topic: meta.Name, Queue: queue}, r),
			mode:        mode,
			closing:     make(chan struct{}),
		}
		if mode == "no-block-support" {
			return struct{ ferry.Queue }{q} // hides TryWrite and Release
		}
		return q
	}
}

func (q *brokenQueue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	if q.mode == "nil-ctx-panics" {
		_ = ctx.Err() // a nil ctx panics here
	}
	if q.mode == "write-not-atomic" {
		if i := slices.Index(msgs, nil); i > 0 {
			_, _ = q.MemoryQueue.Write(ctx, msgs[:i])
		}
	}
	return q.MemoryQueue.Write(ctx, msgs)
}

func (q *brokenQueue) Read(ctx context.Context, offset int64, dst []*ferry.EnhancedMessage) (int, error) {
	_, next := q.Offsets()
	switch {
	case q.mode == "wrong-sentinel" && offset > next:
		return 0, errors.New("no such offset")
	case q.mode == "read-ignores-ctx" && offset == next && len(dst) > 0 && !q.closed.Load():
		<-q.closing
	case q.mode == "read-hangs" && offset == next && len(dst) > 0:
		select {} // the child process panics on the watchdog
	}
	return q.MemoryQueue.Read(ctx, offset, dst)
}

func (q *brokenQueue) Close() error {
	if q.closed.Swap(true) {
		if q.mode == "close-twice-fails" {
			return errors.New("already closed")
		}
		return nil
	}
	close(q.closing)
	return q.MemoryQueue.Close()
}

type unsortedStorage struct{ *ferry.MemoryStorage }

func (s unsortedStorage) Topics(ctx context.Context) ([]ferry.TopicMeta, error) {
	ts, err := s.MemoryStorage.Topics(ctx)
	slices.Reverse(ts)
	return ts, err
}

type zeroCursorStore struct{ *ferry.MemoryCursorStore }

func (s zeroCursorStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	offs, err := s.MemoryCursorStore.Load(ctx, topic, group, queues)
	for i, o := range offs {
		offs[i] = max(o, 0)
	}
	return offs, err
}

// persistentCursors keeps a memory cursor store per directory, so that
// the broken stores below are persistent and fail only where broken.
var persistentCursors sync.Map // dir -> *memoryCursors

// memoryCursors is a memory cursor store whose commits outlive Close, kept
// per directory: a persistent store for the suite.
type memoryCursors struct {
	mu sync.Mutex
	m  map[string]int64
}

type persistentCursorStore struct {
	c      *memoryCursors
	closed atomic.Bool
}

func sharedMemoryCursorStore(dir string) *persistentCursorStore {
	c, _ := persistentCursors.LoadOrStore(dir, &memoryCursors{m: map[string]int64{}})
	return &persistentCursorStore{c: c.(*memoryCursors)}
}

func cursorKey(topic, group string, queue int) string {
	return fmt.Sprintf("%q %q %d", topic, group, queue)
}

func (s *persistentCursorStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queues); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, ferry.ErrClosed
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	out := make([]int64, queues)
	for i := range out {
		off, ok := s.c.m[cursorKey(topic, group, i)]
		if !ok {
			off = -1
		}
		out[i] = off
	}
	return out, nil
}

func (s *persistentCursorStore) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return err
	}
	if offset < 0 {
		return ferry.ErrOffsetOutOfRange
	}
	if s.closed.Load() {
		return ferry.ErrClosed
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.c.m[cursorKey(topic, group, queue)] = offset
	return nil
}

func (s *persistentCursorStore) Close() error {
	s.closed.Store(true)
	return nil
}

// truncatedCursorStore keeps only the first 8 bytes of topic and group
// names, as a fixed-width record might.
type truncatedCursorStore struct{ *persistentCursorStore }

func cut8(s string) string { return s[:min(len(s), 8)] }

func (s truncatedCursorStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queues); err != nil {
		return nil, err
	}
	return s.persistentCursorStore.Load(ctx, cut8(topic), cut8(group), queues)
}

func (s truncatedCursorStore) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return err
	}
	return s.persistentCursorStore.Commit(ctx, cut8(topic), cut8(group), queue, offset)
}

// byteQueueCursorStore keeps the queue index in a byte.
type byteQueueCursorStore struct{ *persistentCursorStore }

func (s byteQueueCursorStore) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	offs, err := s.persistentCursorStore.Load(ctx, topic, group, min(queues, 256))
	if err != nil {
		return nil, err
	}
	out := make([]int64, queues)
	for i := range out {
		out[i] = offs[byte(i)]
	}
	return out, nil
}

func (s byteQueueCursorStore) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return err
	}
	return s.persistentCursorStore.Commit(ctx, topic, group, int(byte(queue)), offset)
}

// idQueue is a queue that reports another ID.
type idQueue struct {
	ferry.Queue
	id ferry.QueueID
}

func (q idQueue) ID() ferry.QueueID { return q.id }

// byteQueueStorage keeps the queue index in a byte: queues 44 and 300
// share one log.
type byteQueueStorage struct{ *ferry.MemoryStorage }

func (s byteQueueStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, queue int) (ferry.Queue, error) {
	if queue < 0 || queue >= meta.Queues {
		return s.MemoryStorage.OpenQueue(ctx, meta, queue)
	}
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, int(byte(queue)))
	if err != nil {
		return nil, err
	}
	return idQueue{q, ferry.QueueID{Topic: meta.Name, Queue: queue}}, nil
}

// truncatedStorage keeps the queues of a topic under the first 8 bytes of
// its name: topics that share them share logs.
type truncatedStorage struct{ *ferry.MemoryStorage }

func (s truncatedStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, queue int) (ferry.Queue, error) {
	if err := meta.Validate(); err != nil || queue < 0 || queue >= meta.Queues {
		return s.MemoryStorage.OpenQueue(ctx, meta, queue)
	}
	cut := meta
	cut.Name = cut8(meta.Name)
	cut.Queues = ferry.MaxQueues
	q, err := s.MemoryStorage.OpenQueue(ctx, cut, queue)
	if err != nil {
		return nil, err
	}
	return idQueue{q, ferry.QueueID{Topic: meta.Name, Queue: queue}}, nil
}

// forgetfulCursorStore's Forget does nothing.
type forgetfulCursorStore struct{ *ferry.MemoryCursorStore }

func (forgetfulCursorStore) Forget(ctx context.Context, topic, group string) error { return nil }

// unfencedCursorStore's CommitFenced ignores the token.
type unfencedCursorStore struct{ *ferry.MemoryCursorStore }

func (s unfencedCursorStore) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	return s.Commit(ctx, topic, group, queue, offset)
}
