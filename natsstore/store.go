package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/nats-io/nats.go/jetstream"
)

// Store keeps Ferry's queues, topics and cursors in NATS JetStream: a
// stream per queue, a KV bucket of topics and one of cursors. It is a
// [ferry.Storage] (with [ferry.SharedStorage]) and a [ferry.CursorStore]
// (with [ferry.CursorGroups] and [ferry.FencedCursorStore]); brokers in
// many processes may share one, each over its own Store.
//
// A Store is safe for concurrent use. It starts goroutines only for the
// queues it opens (see [Store.OpenQueue]); Close closes those queues and
// waits for them. The connection stays the caller's.
type Store struct {
	cfg     config
	js      jetstream.JetStream
	topics  jetstream.KeyValue
	cursors jetstream.KeyValue

	mu     sync.Mutex // guards queues and closed
	queues map[*queue]struct{}
	closed bool
}

var (
	_ ferry.Storage            = (*Store)(nil)
	_ ferry.SharedStorage      = (*Store)(nil)
	_ ferry.CursorStore        = (*Store)(nil)
	_ ferry.CursorGroups       = (*Store)(nil)
	_ ferry.FencedCursorStore  = (*Store)(nil)
	_ ferry.HandoffCursorStore = (*Store)(nil)
)

// Open returns a Store over js, creating its buckets if they are absent
// ("<prefix>_topics", "<prefix>_cursors"). ctx bounds the set-up.
func Open(ctx context.Context, js jetstream.JetStream, opts ...Option) (*Store, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "natsstore: open", Err: err}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, &ferry.Error{Op: "natsstore: open", Err: err}
	}
	if js == nil {
		return nil, &ferry.Error{Op: "natsstore: open", Err: fmt.Errorf("%w: nil JetStream", ferry.ErrInvalidOption)}
	}
	s := &Store{cfg: cfg, js: js, queues: map[*queue]struct{}{}}
	ctx, cancel := cfg.bound(ctx)
	defer cancel()
	if s.topics, err = bucket(ctx, js, cfg, "topics", false, true); err != nil {
		return nil, err
	}
	if s.cursors, err = bucket(ctx, js, cfg, "cursors", false, true); err != nil {
		return nil, err
	}
	for _, kv := range []*jetstream.KeyValue{&s.topics, &s.cursors} {
		if *kv, err = leaderReads(ctx, js, cfg, *kv); err != nil {
			return nil, &ferry.Error{Op: "natsstore: open", Err: err}
		}
	}
	return s, nil
}

// bound gives ctx the op timeout unless it has a deadline.
// directTry bounds a direct get of a Read, a quarter of the op timeout:
// direct gets are answered by any replica of the stream, and one whose
// server is stopped (SIGSTOP, a long GC or VM pause) still holds its
// share of them and answers none; a Read asks the stream's leader
// instead when none came (TestServerPause: Reads of a queue whose server
// was stopped ran out of the op timeout one after another, "read
// orders[1]: context deadline exceeded", stalling its handling for
// seconds after its new leader was elected).
func (c config) directTry() time.Duration { return c.opTimeout / 4 }

func (c config) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.opTimeout)
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// topicValue is a topic's metadata as stored.
type topicValue struct {
	Name        string `json:"name"`
	Queues      int    `json:"queues"`
	MaxMessages int64  `json:"max_messages"`
	MaxBytes    int64  `json:"max_bytes"`
	MaxAgeNanos int64  `json:"max_age_ns"`
	Overflow    int    `json:"overflow"`
	// Incarnation is absent from the values of earlier versions: zero.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// DedupWindowNanos is [ferry.TopicMeta].DedupWindow as given (0:
	// the default, -1: [ferry.DedupOff]); absent in a topic saved before
	// it was kept, which takes the default.
	DedupWindowNanos int64 `json:"dedup_window_ns,omitempty"`
}

func encodeMeta(m ferry.TopicMeta) []byte {
	b, _ := json.Marshal(topicValue{m.Name, m.Queues, m.Retention.MaxMessages, m.Retention.MaxBytes, int64(m.Retention.MaxAge), int(m.Retention.Overflow), m.Incarnation, int64(m.DedupWindow)})
	return b
}

func decodeMeta(b []byte) (ferry.TopicMeta, error) {
	var v topicValue
	if err := json.Unmarshal(b, &v); err != nil {
		return ferry.TopicMeta{}, fmt.Errorf("%w: topic metadata: %v", ferry.ErrCorrupt, err)
	}
	m := ferry.TopicMeta{Name: v.Name, Queues: v.Queues, Retention: ferry.Retention{
		MaxMessages: v.MaxMessages, MaxBytes: v.MaxBytes, MaxAge: timeDuration(v.MaxAgeNanos), Overflow: ferry.Overflow(v.Overflow)}, Incarnation: v.Incarnation,
		DedupWindow: timeDuration(v.DedupWindowNanos)}
	return m, nil
}

// Topics implements [ferry.Storage].
func (s *Store) Topics(ctx context.Context) ([]ferry.TopicMeta, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "natsstore: topics", Err: err}
	}
	if s.isClosed() {
		return nil, &ferry.Error{Op: "natsstore: topics", Err: ferry.ErrClosed}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	var out []ferry.TopicMeta
	es, err := liveEntries(ctx, s.js, s.topics, ">")
	for _, e := range es {
		m, derr := decodeMeta(e.Value())
		if derr != nil {
			err = derr
			break
		}
		out = append(out, m)
	}
	if err != nil {
		return nil, &ferry.Error{Op: "natsstore: topics", Err: err}
	}
	slices.SortFunc(out, func(a, b ferry.TopicMeta) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// SaveTopic implements [ferry.Storage].
func (s *Store) SaveTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "natsstore: save topic", Err: err}
	}
	if err := meta.Validate(); err != nil {
		return &ferry.Error{Op: "natsstore: save topic", Err: err}
	}
	if s.isClosed() {
		return &ferry.Error{Op: "natsstore: save topic", Err: ferry.ErrClosed}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	if _, err := s.topics.Put(ctx, encodeToken(meta.Name), encodeMeta(meta)); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("natsstore: save topic %s", meta.Name), Err: err}
	}
	return nil
}

// CreateTopic implements [ferry.SharedStorage]: a KV create, so of two
// brokers creating one topic at once exactly one writes it.
//
// A replicated bucket refuses a create (as if the key existed) while
// another write of the key is proposed but not yet applied, and a read
// then finds no key (seen: three Stores creating one topic at once). The
// other write lands or fails: the create is asked again until either it
// succeeds or the key is read, or ctx ends.
func (s *Store) CreateTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "natsstore: create topic", Err: err}
	}
	if err := meta.Validate(); err != nil {
		return &ferry.Error{Op: "natsstore: create topic", Err: err}
	}
	if s.isClosed() {
		return &ferry.Error{Op: "natsstore: create topic", Err: ferry.ErrClosed}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	for {
		_, err := s.topics.Create(ctx, encodeToken(meta.Name), encodeMeta(meta))
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return &ferry.Error{Op: fmt.Sprintf("natsstore: create topic %s", meta.Name), Err: err}
		}
		have, err := s.topic(ctx, meta.Name)
		if errors.Is(err, ferry.ErrTopicNotFound) {
			select { // the write the create was refused for is in flight
			case <-time.After(retryBackoff):
				continue
			case <-ctx.Done():
				return &ferry.Error{Op: fmt.Sprintf("natsstore: create topic %s", meta.Name), Err: ctx.Err()}
			}
		}
		if err != nil {
			return &ferry.Error{Op: fmt.Sprintf("natsstore: create topic %s", meta.Name), Err: err}
		}
		if !have.Matches(meta) {
			return &ferry.Error{Op: fmt.Sprintf("natsstore: create topic %s", meta.Name), Err: fmt.Errorf("%w: have %+v", ferry.ErrTopicExists, have)}
		}
		return nil
	}
}

// Topic implements [ferry.SharedStorage].
func (s *Store) Topic(ctx context.Context, name string) (ferry.TopicMeta, error) {
	if err := checkContext(ctx); err != nil {
		return ferry.TopicMeta{}, &ferry.Error{Op: "natsstore: topic", Err: err}
	}
	if err := ferry.ValidateTopicName(name); err != nil {
		return ferry.TopicMeta{}, &ferry.Error{Op: "natsstore: topic", Err: err}
	}
	if s.isClosed() {
		return ferry.TopicMeta{}, &ferry.Error{Op: "natsstore: topic", Err: ferry.ErrClosed}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	m, err := s.topic(ctx, name)
	if err != nil {
		return m, &ferry.Error{Op: fmt.Sprintf("natsstore: topic %s", name), Err: err}
	}
	return m, nil
}

func (s *Store) topic(ctx context.Context, name string) (ferry.TopicMeta, error) {
	e, err := s.topics.Get(ctx, encodeToken(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ferry.TopicMeta{}, ferry.ErrTopicNotFound
	}
	if err != nil {
		return ferry.TopicMeta{}, err
	}
	return decodeMeta(e.Value())
}

// Close implements [io.Closer]: it closes the queues the store opened and
// waits for their goroutines. Idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	qs := make([]*queue, 0, len(s.queues))
	for q := range s.queues {
		qs = append(qs, q)
	}
	s.mu.Unlock()
	for _, q := range qs {
		_ = q.Close()
	}
	return nil
}
