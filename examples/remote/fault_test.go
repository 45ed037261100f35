package remote_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/ferrymq/ferry/examples/remote"
)

func batch(topic string, seq, n, bodySize int) []*ferry.EnhancedMessage {
	msgs := make([]*ferry.EnhancedMessage, n)
	for i := range msgs {
		body := bytes.Repeat([]byte{byte('a' + (seq+i)%26)}, bodySize)
		msgs[i] = &ferry.EnhancedMessage{
			Message: ferry.Message{Topic: topic, Key: fmt.Sprint("k", seq+i), Body: body},
			ID:      ferry.NewMessageID(time.Now()),
		}
	}
	return msgs
}

// readAll reads [from, to) of q.
func readAll(t *testing.T, q ferry.Queue, from, to int64) []*ferry.EnhancedMessage {
	t.Helper()
	var got []*ferry.EnhancedMessage
	dst := make([]*ferry.EnhancedMessage, 64)
	for off := from; off < to; {
		n, err := q.Read(t.Context(), off, dst)
		require.NoError(t, err)
		got = append(got, dst[:n]...)
		off += int64(n)
	}
	return got
}

func nextOffset(t *testing.T, q ferry.Queue) int64 {
	t.Helper()
	_, next, err := q.(ferry.OffsetsContexter).OffsetsContext(t.Context())
	require.NoError(t, err)
	return next
}

// TestWriteCutMidRequest cuts the connection at points spread over a
// Write's request (headers, every part of the body, just past it): each
// Write fails with ErrUnavailable or succeeds, and the queue holds the
// whole batch or none of it, never part; the client then reconnects and
// writes on.
func TestWriteCutMidRequest(t *testing.T) {
	srv := startServer(t, t.TempDir(), "127.0.0.1:0")
	meta := ferry.TopicMeta{Name: "cut", Queues: 1}
	direct, err := dial(t, srv.addr).OpenQueue(t.Context(), meta, 0)
	require.NoError(t, err)

	const n, body = 40, 300
	size := 0
	for _, m := range batch("cut", 0, n, body) {
		size += codec.Size(m)
	}
	var refused, stored int
	for k := range 14 {
		budget := int64(k * (size + 200) / 12)
		p := newProxy(t, srv.addr)
		c := dial(t, p.addr())
		q, err := c.OpenQueue(t.Context(), meta, 0)
		require.NoError(t, err) // the connection is made: the budget is the Write's
		before := nextOffset(t, direct)
		msgs := batch("cut", k*n, n, body)
		p.arm(budget)
		_, werr := q.Write(t.Context(), msgs)
		p.arm(-1)
		after := nextOffset(t, direct)
		switch after - before {
		case 0:
			require.ErrorIs(t, werr, remote.ErrUnavailable, "budget %d: nothing stored", budget)
			refused++
		case n:
			if werr != nil {
				require.ErrorIs(t, werr, remote.ErrUnavailable, "budget %d", budget)
			}
			got := readAll(t, direct, before, after)
			for i, m := range got {
				require.Equal(t, msgs[i].Body, m.Body, "budget %d, message %d", budget, i)
				require.Equal(t, msgs[i].ID, m.ID)
			}
			stored++
		default:
			t.Fatalf("budget %d: %d of %d messages stored (Write: %v)", budget, after-before, n, werr)
		}
		// The same client reconnects and writes on.
		first, err := q.Write(t.Context(), batch("cut", 0, 1, 10))
		require.NoError(t, err, "budget %d: write after the cut", budget)
		require.Equal(t, after, first)
	}
	t.Logf("%d writes cut off and refused, %d stored", refused, stored)
	require.Positive(t, refused, "no cut fell inside a request")
	require.Positive(t, stored, "no budget let a request through")
}

// TestServerRestart: a Read blocked on a server that stops fails with
// ErrUnavailable, as does a Write while it is down; once a server is up
// again on the same address and store, the same Queue writes and reads on
// (it opens the queue on the new server itself).
func TestServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, dir, "127.0.0.1:0")
	st := dial(t, srv.addr)
	meta := ferry.TopicMeta{Name: "restart", Queues: 2}
	q, err := st.OpenQueue(t.Context(), meta, 1)
	require.NoError(t, err)
	_, err = q.Write(t.Context(), batch("restart", 0, 3, 8))
	require.NoError(t, err)

	read := make(chan error, 1)
	go func() {
		_, err := q.Read(context.Background(), 3, make([]*ferry.EnhancedMessage, 4))
		read <- err
	}()
	srv.stop()
	require.ErrorIs(t, <-read, remote.ErrUnavailable)
	_, err = q.Write(t.Context(), batch("restart", 3, 1, 8))
	require.ErrorIs(t, err, remote.ErrUnavailable)

	startServer(t, dir, srv.addr)
	first, err := q.Write(t.Context(), batch("restart", 3, 1, 8))
	require.NoError(t, err)
	require.EqualValues(t, 3, first)
	got := readAll(t, q, 0, 4)
	require.Len(t, got, 4)
	for i, m := range got {
		require.EqualValues(t, i, m.Offset)
		require.Equal(t, 1, m.Queue)
	}
	metas, err := st.Topics(t.Context())
	require.NoError(t, err)
	require.Empty(t, metas, "OpenQueue saves no metadata") // as filestore's OpenQueue
}

// TestServerStopsMidWrite: a Write waiting on the server for room (a
// Block topic) fails with ErrUnavailable when the server stops, and
// stored nothing.
func TestServerStopsMidWrite(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, dir, "127.0.0.1:0")
	st := dial(t, srv.addr)
	meta := ferry.TopicMeta{Name: "block", Queues: 1, Retention: ferry.Retention{MaxMessages: 2, Overflow: ferry.Block}}
	q, err := st.OpenQueue(t.Context(), meta, 0)
	require.NoError(t, err)
	_, err = q.Write(t.Context(), batch("block", 0, 2, 8))
	require.NoError(t, err)
	_, err = q.(ferry.TryWriter).TryWrite(batch("block", 2, 1, 8))
	require.ErrorIs(t, err, ferry.ErrQueueFull)

	wrote := make(chan error, 1)
	go func() {
		_, err := q.Write(context.Background(), batch("block", 2, 1, 8))
		wrote <- err
	}()
	srv.stop()
	require.ErrorIs(t, <-wrote, remote.ErrUnavailable)
	startServer(t, dir, srv.addr)
	require.EqualValues(t, 2, nextOffset(t, q))
}

// TestBadInput: bad addresses and options are errors; a Write whose body
// is not a batch is ErrCorrupt and writes nothing; unknown calls are
// errors, never panics.
func TestBadInput(t *testing.T) {
	for _, addr := range []string{"", "nohost", "host:", "http://x:1", "a:1/b"} {
		_, err := remote.NewStorage(addr)
		require.ErrorIs(t, err, ferry.ErrInvalidOption, "address %q", addr)
	}
	_, err := remote.NewStorage("127.0.0.1:1", remote.WithOpTimeout(0))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = remote.NewStorage("127.0.0.1:1", remote.WithMaxAsync(0))
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	_, err = remote.NewServer(nil)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)

	srv := startServer(t, t.TempDir(), "127.0.0.1:0")
	q, err := dial(t, srv.addr).OpenQueue(t.Context(), ferry.TopicMeta{Name: "bad", Queues: 1}, 0)
	require.NoError(t, err)
	call := func(method, path, body string) wireError {
		rec := httptest.NewRecorder()
		srv.srv.ServeHTTP(rec, httptest.NewRequest(method, path, bytes.NewReader([]byte(body))))
		require.NotEqual(t, http.StatusOK, rec.Code, "%s %s", method, path)
		var we wireError
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &we), "%s %s: %s", method, path, rec.Body)
		return we
	}
	for _, body := range []string{"", "\x01", "\x01\x05\x01garbage", "\x01\x01" + string(codecOf("bad")) + "tail", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"} {
		we := call(http.MethodPost, "/ferry.remote.v1/Write?topic=bad&queue=0", body)
		require.Equal(t, "corrupt", we.Code, "body %q: %s", body, we.Message)
	}
	require.EqualValues(t, 0, nextOffset(t, q))
	require.Equal(t, "not_open", call(http.MethodPost, "/ferry.remote.v1/Read?topic=bad&queue=7&offset=0&max=1", "").Code)
	require.Equal(t, "invalid_option", call(http.MethodPost, "/ferry.remote.v1/Read?topic=bad&queue=0&offset=x&max=1", "").Code)
	require.Equal(t, "invalid_option", call(http.MethodPost, "/ferry.remote.v1/Read?topic=bad&queue=0&offset=0&max=0", "").Code)
	require.Equal(t, "invalid_option", call(http.MethodPost, "/ferry.remote.v1/Nope", "").Code)
	require.Equal(t, "invalid_option", call(http.MethodGet, "/ferry.remote.v1/Topics", "").Code)
	require.Equal(t, "invalid_option", call(http.MethodPost, "/elsewhere", "").Code)
	require.Equal(t, "invalid_option", call(http.MethodPost, "/ferry.remote.v1/SaveTopic", "{").Code)
	require.Equal(t, "invalid_topic", call(http.MethodPost, "/ferry.remote.v1/OpenQueue", `{"meta":{"Name":"bad","Queues":1},"queue":3}`).Code)
}

type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func codecOf(topic string) []byte {
	return codec.Append(nil, batch(topic, 0, 1, 4)[0])
}

// TestTooLargeForOneCall: a write of more bytes than one call carries is
// ErrMessageTooLarge before anything is sent, synchronous or not.
func TestTooLargeForOneCall(t *testing.T) {
	srv := startServer(t, t.TempDir(), "127.0.0.1:0")
	q, err := dial(t, srv.addr).OpenQueue(t.Context(), ferry.TopicMeta{Name: "big", Queues: 1}, 0)
	require.NoError(t, err)
	huge := []*ferry.EnhancedMessage{{Message: ferry.Message{Topic: "big", Body: make([]byte, 64<<20)}}}
	_, err = q.Write(t.Context(), huge)
	require.ErrorIs(t, err, ferry.ErrMessageTooLarge)
	got := make(chan error, 1)
	q.(ferry.AsyncWriter).WriteAsync(t.Context(), huge, func(_ int64, err error) { got <- err })
	require.ErrorIs(t, <-got, ferry.ErrMessageTooLarge)
	require.EqualValues(t, 0, nextOffset(t, q))
}

// TestReadCutMidResponse cuts the connection at points spread over a
// Read's answer: each Read fails with ErrUnavailable or returns whole
// messages, never part of one; the client then reconnects and reads on.
func TestReadCutMidResponse(t *testing.T) {
	srv := startServer(t, t.TempDir(), "127.0.0.1:0")
	meta := ferry.TopicMeta{Name: "cutread", Queues: 1}
	direct, err := dial(t, srv.addr).OpenQueue(t.Context(), meta, 0)
	require.NoError(t, err)
	const n, body = 40, 300
	msgs := batch("cutread", 0, n, body)
	_, err = direct.Write(t.Context(), msgs)
	require.NoError(t, err)
	size := 0
	for _, m := range msgs {
		size += codec.Size(m)
	}
	var failed, whole int
	for k := range 14 {
		budget := int64(k * (size + 200) / 12)
		p := newProxy(t, srv.addr)
		q, err := dial(t, p.addr()).OpenQueue(t.Context(), meta, 0)
		require.NoError(t, err)
		p.armReplies(budget)
		dst := make([]*ferry.EnhancedMessage, n)
		got, rerr := q.Read(t.Context(), 0, dst)
		p.armReplies(-1)
		if rerr != nil {
			require.ErrorIs(t, rerr, remote.ErrUnavailable, "budget %d", budget)
			require.Zero(t, got)
			failed++
		} else {
			require.Equal(t, n, got, "budget %d", budget)
			whole++
		}
		for i := range got {
			require.Equal(t, msgs[i].Body, dst[i].Body, "budget %d, message %d", budget, i)
			require.EqualValues(t, i, dst[i].Offset)
		}
		// The same client reconnects and reads on.
		got, err = q.Read(t.Context(), n-1, dst)
		require.NoError(t, err, "budget %d: read after the cut", budget)
		require.Equal(t, 1, got)
	}
	t.Logf("%d reads cut off, %d whole", failed, whole)
	require.Positive(t, failed, "no cut fell inside an answer")
	require.Positive(t, whole, "no budget let an answer through")
}
