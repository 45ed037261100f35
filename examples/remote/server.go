package remote

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/ferrymq/ferry"
)

// Server serves the queues of a [ferry.Storage] (a filestore, in the
// example's program) to [Storage] clients over HTTP/2 without TLS, and
// its cursors where it is also a [ferry.CursorStore] (a filestore is). It
// is an [http.Handler], so it can be mounted in a server of your own;
// [Server.Serve] runs one of its own. It has no authentication: serve it
// on a trusted network only.
//
// A Server opens queues when clients ask and keeps them open until Close;
// it does not close the storage, which the caller owns. Its methods are
// safe for concurrent use.
type Server struct {
	st   ferry.Storage
	hs   *http.Server
	ctx  context.Context // ends with Close; every request's context derives from it
	stop context.CancelFunc

	openMu   sync.Mutex // serialises opening queues, and CreateTopic where the storage has none
	mu       sync.Mutex // guards queues, closed and handlers' Add
	queues   map[ferry.QueueID]ferry.Queue
	closed   bool
	handlers sync.WaitGroup // requests being served
}

// NewServer returns a server of st's queues. It starts nothing: serve it
// with [Server.Serve] or mount it in an [http.Server] (which must speak
// HTTP/2 without TLS, as Serve's does).
func NewServer(st ferry.Storage) (*Server, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: remote: nil storage", ferry.ErrInvalidOption)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{st: st, ctx: ctx, stop: stop, queues: make(map[ferry.QueueID]ferry.Queue)}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	s.hs = &http.Server{
		Handler:     s,
		Protocols:   &p,
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	return s, nil
}

// Serve accepts connections on l until Close, serving each on a goroutine
// of its own that Close stops. It returns nil after Close, or why
// accepting failed. It closes l.
func (s *Server) Serve(l net.Listener) error {
	err := s.hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving: it closes the listeners and connections of Serve,
// ends the requests in flight (a blocked Read's client gets an error) and
// waits for them, then closes the queues it opened. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.stop()
	err := s.hs.Close()
	s.handlers.Wait()
	s.openMu.Lock()
	defer s.openMu.Unlock()
	for _, q := range s.queues {
		err = errors.Join(err, q.Close())
	}
	clear(s.queues)
	return err
}

// ServeHTTP serves one call of the wire protocol.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		writeError(w, fmt.Errorf("%w: remote server", ferry.ErrClosed))
		return
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()
	// A request ends with the client's stream or with Close.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	if r.Method != http.MethodPost {
		writeError(w, fmt.Errorf("%w: remote: method %s, want POST", ferry.ErrInvalidOption, r.Method))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		// A body cut off (the client or its connection gone) is never
		// acted on: a batch is written whole or not at all.
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			err = fmt.Errorf("%w: remote: request of more than %d bytes", ferry.ErrMessageTooLarge, tooLarge.Limit)
		}
		writeError(w, fmt.Errorf("remote: read request: %w", err))
		return
	}
	method, ok := cutPrefix(r.URL.Path, pathPrefix)
	if !ok {
		writeError(w, fmt.Errorf("%w: remote: unknown path %q", ferry.ErrInvalidOption, r.URL.Path))
		return
	}
	var resp []byte
	switch method {
	case mWrite:
		resp, err = s.write(ctx, r, body)
	case mRead:
		resp, err = s.read(ctx, r)
	default:
		var v any
		v, err = s.control(ctx, r, method, body)
		if err == nil {
			resp, err = marshal(v)
		}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(resp)))
	_, _ = w.Write(resp)
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false
	}
	return s[len(prefix):], true
}

// writeError answers err, with a status that tells a client error from
// the server's.
func writeError(w http.ResponseWriter, err error) {
	we := wireError{Code: errorCode(err), Message: err.Error()}
	status := http.StatusBadRequest
	switch we.Code {
	case codeNotOpen:
		status = http.StatusNotFound
	case codeUnavailable:
		status = http.StatusServiceUnavailable
	case codeInternal, codeCanceled:
		status = http.StatusInternalServerError
	}
	b, _ := json.Marshal(we) // two strings: cannot fail
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// errNotOpen is the error of a call on a queue the server has not opened.
type errNotOpen struct{ id ferry.QueueID }

func (e errNotOpen) Error() string {
	return fmt.Sprintf("remote: queue %s/%d is not open on this server", e.id.Topic, e.id.Queue)
}

// queueOf returns the open queue the request's query names.
func (s *Server) queueOf(r *http.Request) (ferry.Queue, error) {
	q := r.URL.Query()
	i, err := strconv.Atoi(q.Get("queue"))
	if err != nil {
		return nil, fmt.Errorf("%w: remote: queue index %q", ferry.ErrInvalidTopic, q.Get("queue"))
	}
	id := ferry.QueueID{Topic: q.Get("topic"), Queue: i}
	s.mu.Lock()
	fq, ok := s.queues[id]
	s.mu.Unlock()
	if !ok {
		return nil, errNotOpen{id}
	}
	return fq, nil
}

// control serves the calls with JSON bodies.
func (s *Server) control(ctx context.Context, r *http.Request, method string, body []byte) (any, error) {
	switch method {
	case mOpenQueue:
		var req openRequest
		if err := unmarshal(body, &req); err != nil {
			return nil, err
		}
		q, err := s.open(ctx, req.Meta, req.Queue)
		if err != nil {
			return nil, err
		}
		oldest, next, err := offsets(ctx, q)
		return offsetsResponse{oldest, next}, err
	case mTopics:
		metas, err := s.st.Topics(ctx)
		if metas == nil {
			metas = []ferry.TopicMeta{}
		}
		return metas, err
	case mSaveTopic:
		var meta ferry.TopicMeta
		if err := unmarshal(body, &meta); err != nil {
			return nil, err
		}
		return struct{}{}, s.st.SaveTopic(ctx, meta)
	case mCreateTopic:
		var meta ferry.TopicMeta
		if err := unmarshal(body, &meta); err != nil {
			return nil, err
		}
		return struct{}{}, s.createTopic(ctx, meta)
	case mTopic:
		var req nameRequest
		if err := unmarshal(body, &req); err != nil {
			return nil, err
		}
		return s.topic(ctx, req.Name)
	case mDeleteTopic:
		var req nameRequest
		if err := unmarshal(body, &req); err != nil {
			return nil, err
		}
		return struct{}{}, s.deleteTopic(ctx, req.Name)
	case mOffsets:
		q, err := s.queueOf(r)
		if err != nil {
			return nil, err
		}
		oldest, next, err := offsets(ctx, q)
		return offsetsResponse{oldest, next}, err
	case mLoad, mCommit, mCommitFenced, mCursors, mForget:
		return s.cursor(ctx, method, body)
	case mRelease:
		q, err := s.queueOf(r)
		if err != nil {
			return nil, err
		}
		off, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: remote: release offset %q", ferry.ErrInvalidOption, r.URL.Query().Get("offset"))
		}
		if rl, ok := q.(ferry.Releaser); ok {
			rl.Release(off)
		}
		return struct{}{}, nil
	}
	return nil, fmt.Errorf("%w: remote: unknown method %q", ferry.ErrInvalidOption, method)
}

func unmarshal(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: remote: request body: %w", ferry.ErrInvalidOption, err)
	}
	return nil
}

func offsets(ctx context.Context, q ferry.Queue) (oldest, next int64, err error) {
	if oc, ok := q.(ferry.OffsetsContexter); ok {
		return oc.OffsetsContext(ctx)
	}
	oldest, next = q.Offsets()
	return oldest, next, nil
}

// open returns queue i of meta's topic, opening it on the storage the
// first time.
func (s *Server) open(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	id := ferry.QueueID{Topic: meta.Name, Queue: i}
	s.mu.Lock()
	q, ok := s.queues[id]
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: remote server", ferry.ErrClosed)
	}
	if ok {
		return q, nil
	}
	q, err := s.st.OpenQueue(ctx, meta, i)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.queues[id] = q
	s.mu.Unlock()
	return q, nil
}

func (s *Server) createTopic(ctx context.Context, meta ferry.TopicMeta) error {
	if ss, ok := s.st.(ferry.SharedStorage); ok {
		return ss.CreateTopic(ctx, meta)
	}
	// The server is the storage's one user: under openMu, look and save
	// is as good as create-if-absent.
	if err := meta.Validate(); err != nil {
		return err
	}
	s.openMu.Lock()
	defer s.openMu.Unlock()
	got, err := s.topic(ctx, meta.Name)
	switch {
	case errors.Is(err, ferry.ErrTopicNotFound):
		return s.st.SaveTopic(ctx, meta)
	case err != nil:
		return err
	case !got.Matches(meta):
		return fmt.Errorf("%w: remote: topic %q", ferry.ErrTopicExists, meta.Name)
	}
	return nil
}

func (s *Server) topic(ctx context.Context, name string) (ferry.TopicMeta, error) {
	if ss, ok := s.st.(ferry.SharedStorage); ok {
		return ss.Topic(ctx, name)
	}
	metas, err := s.st.Topics(ctx)
	if err != nil {
		return ferry.TopicMeta{}, err
	}
	if i := slices.IndexFunc(metas, func(m ferry.TopicMeta) bool { return m.Name == name }); i >= 0 {
		return metas[i], nil
	}
	return ferry.TopicMeta{}, fmt.Errorf("%w: remote: topic %q", ferry.ErrTopicNotFound, name)
}

// deleteTopic forgets the topic's open queues, then deletes it on the
// storage (which closes them).
func (s *Server) deleteTopic(ctx context.Context, name string) error {
	td, ok := s.st.(ferry.TopicDeleter)
	if !ok {
		return fmt.Errorf("%w: remote: storage %T cannot delete topics", ferry.ErrInvalidOption, s.st)
	}
	s.openMu.Lock()
	defer s.openMu.Unlock()
	s.mu.Lock()
	for id := range s.queues {
		if id.Topic == name {
			delete(s.queues, id)
		}
	}
	s.mu.Unlock()
	return td.DeleteTopic(ctx, name)
}

// write serves Write: every batch is decoded before any is written, then
// the batches are written in order, each whole or not at all. Several
// batches go to the queue as one write (one group commit), and one by
// one only if that fails, to tell each its own outcome.
func (s *Server) write(ctx context.Context, r *http.Request, body []byte) ([]byte, error) {
	q, err := s.queueOf(r)
	if err != nil {
		return nil, err
	}
	batches, err := decodeBatches(body)
	if err != nil {
		return nil, err
	}
	try := r.URL.Query().Get("try") == "1"
	tw, _ := q.(ferry.TryWriter)
	if try && tw == nil {
		return nil, fmt.Errorf("%w: remote: queue %T cannot TryWrite", ferry.ErrInvalidOption, q)
	}
	writeOne := func(msgs []*ferry.EnhancedMessage) (int64, error) {
		if try {
			return tw.TryWrite(msgs)
		}
		return q.Write(ctx, msgs)
	}
	firsts := make([]int64, len(batches))
	errs := make([]error, len(batches))
	merged := len(batches) > 1
	if merged {
		var all []*ferry.EnhancedMessage
		for _, b := range batches {
			all = append(all, b...)
		}
		first, err := writeOne(all)
		if err == nil {
			for i, b := range batches {
				firsts[i] = first
				first += int64(len(b))
			}
		} else {
			merged = false
		}
	}
	if !merged {
		for i, b := range batches {
			firsts[i], errs[i] = writeOne(b)
		}
	}
	var resp []byte
	for i, b := range batches {
		resp = appendWriteResult(resp, firsts[i], b, errs[i])
	}
	oldest, next := q.Offsets()
	resp = binary.AppendVarint(resp, oldest)
	return binary.AppendVarint(resp, next), nil
}

// read serves Read: it blocks, as the queue's Read does, until a message
// is there or the client gives up.
func (s *Server) read(ctx context.Context, r *http.Request) ([]byte, error) {
	q, err := s.queueOf(r)
	if err != nil {
		return nil, err
	}
	qv := r.URL.Query()
	off, err := strconv.ParseInt(qv.Get("offset"), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: remote: read offset %q", ferry.ErrInvalidOption, qv.Get("offset"))
	}
	n, err := strconv.Atoi(qv.Get("max"))
	if err != nil || n < 1 || n > maxReadMessages {
		return nil, fmt.Errorf("%w: remote: read max %q not in [1, %d]", ferry.ErrInvalidOption, qv.Get("max"), maxReadMessages)
	}
	dst := make([]*ferry.EnhancedMessage, n)
	n, err = q.Read(ctx, off, dst)
	if err != nil {
		return nil, err
	}
	oldest, next := q.Offsets()
	return appendReadResponse(nil, oldest, next, dst[:n]), nil
}
