package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ferrymq/ferry"
)

// ErrUnavailable is wrapped by the errors of calls that did not get an
// answer from the server: it is down, restarting, unreachable or shutting
// down. A Write that fails with it may or may not have been stored; a
// later call reconnects.
var ErrUnavailable = errors.New("remote: server unavailable")

// Option configures a [Storage].
type Option func(*config)

type config struct {
	opTimeout time.Duration
	maxAsync  int
}

// WithOpTimeout bounds the calls that take no context: [Queue.Offsets]
// and [Queue.Release]. Default: 5 s.
func WithOpTimeout(d time.Duration) Option { return func(c *config) { c.opTimeout = d } }

// WithMaxAsync bounds the writes [Queue.WriteAsync] keeps pending per
// queue; past it, WriteAsync waits. Default: 4096.
func WithMaxAsync(n int) Option { return func(c *config) { c.maxAsync = n } }

// Storage is a [ferry.Storage] whose queues live on a [Server] in another
// process: hand it to [ferry.WithStorage] and an unmodified broker,
// producer and consumer group run on them. It also implements
// [ferry.SharedStorage] and [ferry.TopicDeleter] (several brokers may
// share one server), and, where the server's storage keeps cursors (a
// filestore does), [ferry.CursorStore], [ferry.CursorGroups] and
// [ferry.FencedCursorStore]: hand it to [ferry.WithCursorStore] too.
//
// It keeps one HTTP/2 connection to the server, made on the first call
// and made again on the call after it broke: a server that restarts is
// reconnected, and queues opened before are opened again on it. A call
// that gets no answer fails with [ErrUnavailable]; nothing is retried
// behind the caller's back (a consumer's fetch loop retries its reads).
//
// A Storage is safe for concurrent use. Close closes the queues it
// opened and waits for the calls in flight.
type Storage struct {
	base string // "http://host:port" + pathPrefix
	cfg  config
	tr   *http.Transport
	hc   *http.Client
	ctx  context.Context // ends with Close
	stop context.CancelFunc

	mu     sync.Mutex // guards queues, closed and calls' Add
	queues map[*Queue]struct{}
	closed bool
	calls  sync.WaitGroup // calls in flight
}

var (
	_ ferry.Storage       = (*Storage)(nil)
	_ ferry.SharedStorage = (*Storage)(nil)
	_ ferry.TopicDeleter  = (*Storage)(nil)
)

// NewStorage returns a storage of the queues served at addr ("host:port").
// It does not connect: the first call does, so a client may start before
// its server.
func NewStorage(addr string, opts ...Option) (*Storage, error) {
	cfg := config{opTimeout: 5 * time.Second, maxAsync: 4096}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.opTimeout <= 0 {
		return nil, fmt.Errorf("%w: remote: op timeout %v, want > 0", ferry.ErrInvalidOption, cfg.opTimeout)
	}
	if cfg.maxAsync < 1 {
		return nil, fmt.Errorf("%w: remote: max async %d, want >= 1", ferry.ErrInvalidOption, cfg.maxAsync)
	}
	u, err := url.Parse("http://" + addr)
	if err != nil || u.Host != addr || u.Port() == "" {
		return nil, fmt.Errorf("%w: remote: address %q, want host:port", ferry.ErrInvalidOption, addr)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true) // HTTP/2 with prior knowledge: no TLS, no upgrade
	tr := &http.Transport{
		Protocols: &p,
		// A connection that hears nothing for SendPingTimeout is pinged
		// and dropped if the ping goes unanswered: a server behind a
		// broken network fails the calls in flight instead of hanging
		// them (a server that exits resets the connection at once).
		// No ResponseHeaderTimeout: a Read waits on the server for as
		// long as its context allows.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 10 * time.Second, PingTimeout: 5 * time.Second},
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Storage{
		base:   "http://" + addr + pathPrefix,
		cfg:    cfg,
		tr:     tr,
		hc:     &http.Client{Transport: tr},
		ctx:    ctx,
		stop:   stop,
		queues: make(map[*Queue]struct{}),
	}, nil
}

// Close closes the queues the storage opened (reporting their pending
// writes), ends the calls in flight with [ferry.ErrClosed], waits for
// them and closes the connection. Close is idempotent.
func (s *Storage) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	qs := make([]*Queue, 0, len(s.queues))
	for q := range s.queues {
		qs = append(qs, q)
	}
	s.mu.Unlock()
	var err error
	for _, q := range qs {
		err = errors.Join(err, q.Close())
	}
	s.stop()
	s.calls.Wait()
	s.tr.CloseIdleConnections()
	return err
}

// begin counts a call in flight, unless the storage is closed.
func (s *Storage) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ferry.ErrClosed
	}
	s.calls.Add(1)
	return nil
}

// call makes one call of the wire protocol: method with query and body,
// bounded by ctx and ended by life (the storage's or a queue's lifetime,
// ending as ErrClosed). It returns the response body of a 200, the
// server's error otherwise.
func (s *Storage) call(ctx, life context.Context, op, method string, query url.Values, body []byte) ([]byte, error) {
	fail := func(err error) error { return &ferry.Error{Op: "remote " + op, Err: err} }
	if ctx == nil {
		return nil, fail(fmt.Errorf("%w: nil context", ferry.ErrInvalidOption))
	}
	if err := s.begin(); err != nil {
		return nil, fail(err)
	}
	defer s.calls.Done()
	if life.Err() != nil {
		return nil, fail(ferry.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(life, cancel)
	defer stop()
	u := s.base + method
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, fail(fmt.Errorf("%w: %w", ferry.ErrInvalidOption, err))
	}
	resp, err := s.hc.Do(req)
	var b []byte
	if err == nil {
		// ReadAll fails on a body cut short (a server killed while
		// answering): a response is used whole or not at all.
		b, err = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
	}
	switch {
	case err != nil && life.Err() != nil:
		return nil, fail(ferry.ErrClosed)
	case err != nil && ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		return nil, fail(fmt.Errorf("%w: %w", ErrUnavailable, err))
	case resp.StatusCode != http.StatusOK:
		var we wireError
		if json.Unmarshal(b, &we) != nil || we.Code == "" {
			return nil, fail(fmt.Errorf("%w: status %s: %q", ErrUnavailable, resp.Status, truncate(b)))
		}
		return nil, decodeError(we)
	}
	return b, nil
}

func truncate(b []byte) string {
	const limit = 200
	if len(b) > limit {
		return string(b[:limit]) + "…"
	}
	return strings.TrimSpace(string(b))
}

// control makes a JSON call: req (nil for none) as the body, the
// response decoded into resp (nil to ignore it).
func (s *Storage) control(ctx, life context.Context, op, method string, query url.Values, req, resp any) error {
	var body []byte
	if req != nil {
		var err error
		if body, err = marshal(req); err != nil {
			return &ferry.Error{Op: "remote " + op, Err: err}
		}
	}
	b, err := s.call(ctx, life, op, method, query, body)
	if err != nil {
		return err
	}
	if resp != nil {
		if err := json.Unmarshal(b, resp); err != nil {
			return &ferry.Error{Op: "remote " + op, Err: fmt.Errorf("%w: response: %w", ferry.ErrCorrupt, err)}
		}
	}
	return nil
}

// OpenQueue opens queue i of meta's topic on the server, creating it
// empty if needed, and returns its client. Invalid metadata or index is
// [ferry.ErrInvalidTopic], checked before any call.
func (s *Storage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	op := fmt.Sprintf("open queue %s/%d", meta.Name, i)
	if ctx == nil {
		return nil, &ferry.Error{Op: "remote " + op, Err: fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)}
	}
	if err := meta.Validate(); err != nil {
		return nil, err
	}
	if i < 0 || i >= meta.Queues {
		return nil, &ferry.Error{Op: "remote " + op, Err: fmt.Errorf("%w: index not in [0, %d)", ferry.ErrInvalidTopic, meta.Queues)}
	}
	q := newQueue(s, meta, i)
	var off offsetsResponse
	if err := s.control(ctx, s.ctx, op, mOpenQueue, nil, openRequest{Meta: meta, Queue: i}, &off); err != nil {
		q.stop()
		return nil, err
	}
	q.seen(off.Oldest, off.Next)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		q.stop()
		return nil, &ferry.Error{Op: "remote " + op, Err: ferry.ErrClosed}
	}
	s.queues[q] = struct{}{}
	return q, nil
}

// forget drops q, closed, from the open queues.
func (s *Storage) forget(q *Queue) {
	s.mu.Lock()
	delete(s.queues, q)
	s.mu.Unlock()
}

// Topics returns the topics saved on the server, sorted by name.
func (s *Storage) Topics(ctx context.Context) ([]ferry.TopicMeta, error) {
	var metas []ferry.TopicMeta
	if err := s.control(ctx, s.ctx, "topics", mTopics, nil, nil, &metas); err != nil {
		return nil, err
	}
	return metas, nil
}

// SaveTopic records meta on the server. Invalid metadata is
// [ferry.ErrInvalidTopic], checked before any call.
func (s *Storage) SaveTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if ctx != nil {
		if err := meta.Validate(); err != nil {
			return err
		}
	}
	return s.control(ctx, s.ctx, "save topic "+meta.Name, mSaveTopic, nil, meta, nil)
}

// CreateTopic records meta on the server unless it holds the topic (see
// [ferry.SharedStorage]).
func (s *Storage) CreateTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if ctx != nil {
		if err := meta.Validate(); err != nil {
			return err
		}
	}
	return s.control(ctx, s.ctx, "create topic "+meta.Name, mCreateTopic, nil, meta, nil)
}

// Topic returns the metadata of the named topic; [ferry.ErrTopicNotFound]
// if the server holds none.
func (s *Storage) Topic(ctx context.Context, name string) (ferry.TopicMeta, error) {
	var meta ferry.TopicMeta
	err := s.control(ctx, s.ctx, "topic "+name, mTopic, nil, nameRequest{Name: name}, &meta)
	return meta, err
}

// DeleteTopic deletes the topic on the server (see [ferry.TopicDeleter])
// and closes this storage's queues of it.
func (s *Storage) DeleteTopic(ctx context.Context, name string) error {
	if ctx != nil {
		if err := ferry.ValidateTopicName(name); err != nil {
			return err
		}
	}
	if err := s.control(ctx, s.ctx, "delete topic "+name, mDeleteTopic, nil, nameRequest{Name: name}, nil); err != nil {
		return err
	}
	s.mu.Lock()
	var qs []*Queue
	for q := range s.queues {
		if q.id.Topic == name {
			qs = append(qs, q)
		}
	}
	s.mu.Unlock()
	var err error
	for _, q := range qs {
		err = errors.Join(err, q.Close())
	}
	return err
}
