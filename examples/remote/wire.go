package remote

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
)

// The wire protocol: every call is an HTTP/2 POST to pathPrefix+method.
// Calls on a queue name it in the query (topic, queue). Control calls
// carry JSON; Write and Read carry messages in Ferry's codec, framed by
// uvarint counts (see appendBatches and readResponse). A failed call
// answers with a non-200 status and a JSON wireError.
const pathPrefix = "/ferry.remote.v1/"

// The methods.
const (
	mOpenQueue   = "OpenQueue"
	mTopics      = "Topics"
	mSaveTopic   = "SaveTopic"
	mCreateTopic = "CreateTopic"
	mTopic       = "Topic"
	mDeleteTopic = "DeleteTopic"
	mWrite       = "Write"
	mRead        = "Read"
	mOffsets     = "Offsets"
	mRelease     = "Release"
)

// Limits of one call.
const (
	maxRequestBytes = 64 << 20                // a Write's body
	maxBatchBytes   = maxRequestBytes - 1<<10 // one write's messages, encoded, leaving room for the framing
	maxReadMessages = 4096                    // messages one Read returns
	maxBatches      = 1 << 16                 // batches one Write carries
)

// openRequest is OpenQueue's body.
type openRequest struct {
	Meta  ferry.TopicMeta `json:"meta"`
	Queue int             `json:"queue"`
}

// nameRequest is the body of Topic and DeleteTopic.
type nameRequest struct {
	Name string `json:"name"`
}

// offsetsResponse answers OpenQueue and Offsets.
type offsetsResponse struct {
	Oldest int64 `json:"oldest"`
	Next   int64 `json:"next"`
}

// wireError is the body of a failed call: Code names the sentinel the
// error wrapped (see codes), Message is its text.
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Codes that name no ferry sentinel.
const (
	codeNotOpen     = "not_open"    // the server has not opened the queue (it restarted): open it again
	codeUnavailable = "unavailable" // the server's storage or queue is closed: it is shutting down
	codeCanceled    = "canceled"    // the call's context ended on the server
	codeInternal    = "internal"
)

// codes maps the sentinels that cross the wire to their codes. ErrClosed
// is not among them: a server's closed queue is codeUnavailable, so that
// only the client's own Close makes [ferry.ErrClosed].
var codes = []struct {
	code string
	err  error
}{
	{"invalid_option", ferry.ErrInvalidOption},
	{"invalid_topic", ferry.ErrInvalidTopic},
	{"invalid_message", ferry.ErrInvalidMessage},
	{"message_too_large", ferry.ErrMessageTooLarge},
	{"offset_out_of_range", ferry.ErrOffsetOutOfRange},
	{"queue_full", ferry.ErrQueueFull},
	{"topic_exists", ferry.ErrTopicExists},
	{"topic_not_found", ferry.ErrTopicNotFound},
	{"corrupt", ferry.ErrCorrupt},
	{"fenced", ferry.ErrFenced},
	{"group_not_found", ferry.ErrGroupNotFound},
}

// errorCode returns the code of err.
func errorCode(err error) string {
	var notOpen errNotOpen
	if errors.As(err, &notOpen) {
		return codeNotOpen
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	switch {
	case errors.Is(err, ferry.ErrClosed):
		return codeUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return codeCanceled
	}
	return codeInternal
}

// ServerError is an error the server returned: its text is the server's,
// and it unwraps to the sentinel its code names ([ErrUnavailable] for a
// server shutting down; nil for an error of no sentinel).
type ServerError struct {
	Code    string // the wire code
	Message string // the server's error text
	err     error
}

func (e *ServerError) Error() string { return e.Message }

// Unwrap returns the sentinel the code names.
func (e *ServerError) Unwrap() error { return e.err }

// decodeError turns a wireError into the client's error.
func decodeError(we wireError) error {
	e := &ServerError{Code: we.Code, Message: we.Message}
	for _, c := range codes {
		if c.code == we.Code {
			e.err = c.err
		}
	}
	if we.Code == codeUnavailable || we.Code == codeCanceled {
		// The server gave up on the call (its storage or queue closed,
		// or it is shutting down): the client's own context did not end.
		e.err = ErrUnavailable
	}
	return e
}

// appendBatches appends a Write's body: the batch count, then per batch
// its message count and its messages in codec encoding.
func appendBatches(dst []byte, batches [][]*ferry.EnhancedMessage) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(batches)))
	for _, b := range batches {
		dst = binary.AppendUvarint(dst, uint64(len(b)))
		for _, m := range b {
			dst = codec.Append(dst, m)
		}
	}
	return dst
}

// reader reads the uvarint-framed bodies; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: remote: %s", ferry.ErrCorrupt, what)
	}
	r.b = nil
}

func (r *reader) uvarint(max uint64, what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 || v > max {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint(what string) int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) message() *ferry.EnhancedMessage {
	if r.err != nil {
		return nil
	}
	m, n, err := codec.Decode(r.b)
	if err != nil {
		r.err = err
		r.b = nil
		return nil
	}
	r.b = r.b[n:]
	return m
}

func (r *reader) str(what string) string {
	n := r.uvarint(uint64(len(r.b)), what)
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// end reports an error unless every byte was read.
func (r *reader) end() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail(fmt.Sprintf("%d bytes after the end", len(r.b)))
	}
	return r.err
}

// decodeBatches reads a Write's body. A message count is checked against
// the bytes left (a message takes at least 17) before anything is
// allocated.
func decodeBatches(b []byte) ([][]*ferry.EnhancedMessage, error) {
	r := &reader{b: b}
	nb := r.uvarint(maxBatches, "batch count")
	batches := make([][]*ferry.EnhancedMessage, 0, nb)
	for range nb {
		n := r.uvarint(uint64(len(r.b)/17), "message count")
		batch := make([]*ferry.EnhancedMessage, 0, n)
		for range n {
			batch = append(batch, r.message())
		}
		if r.err != nil {
			return nil, r.err
		}
		batches = append(batches, batch)
	}
	return batches, r.end()
}

// Each batch's outcome in a Write's response: statusOK, the first offset
// and each message's store time; or statusError, the code and the text.
// The queue's offsets follow the last batch.
const (
	statusOK    = 0
	statusError = 1
)

// writeResult is one batch's outcome.
type writeResult struct {
	first  int64
	stored []int64 // each message's StoreUnixNano
	err    error
}

func appendWriteResult(dst []byte, first int64, msgs []*ferry.EnhancedMessage, err error) []byte {
	if err != nil {
		dst = append(dst, statusError)
		code := errorCode(err)
		dst = binary.AppendUvarint(dst, uint64(len(code)))
		dst = append(dst, code...)
		msg := err.Error()
		dst = binary.AppendUvarint(dst, uint64(len(msg)))
		return append(dst, msg...)
	}
	dst = append(dst, statusOK)
	dst = binary.AppendVarint(dst, first)
	for _, m := range msgs {
		dst = binary.AppendVarint(dst, m.StoreUnixNano)
	}
	return dst
}

// decodeWriteResponse reads a Write's response for batches of the sizes
// given, then the queue's offsets.
func decodeWriteResponse(b []byte, sizes []int) (res []writeResult, oldest, next int64, err error) {
	r := &reader{b: b}
	res = make([]writeResult, len(sizes))
	for i, n := range sizes {
		if len(r.b) == 0 {
			r.fail("write response cut short")
			break
		}
		status := r.b[0]
		r.b = r.b[1:]
		switch status {
		case statusOK:
			res[i].first = r.varint("first offset")
			res[i].stored = make([]int64, n)
			for j := range n {
				res[i].stored[j] = r.varint("store time")
			}
		case statusError:
			code := r.str("error code")
			msg := r.str("error text")
			res[i].err = decodeError(wireError{Code: code, Message: msg})
		default:
			r.fail(fmt.Sprintf("write status %d", status))
		}
	}
	oldest, next = r.varint("oldest offset"), r.varint("next offset")
	if err := r.end(); err != nil {
		return nil, 0, 0, err
	}
	return res, oldest, next, nil
}

// appendReadResponse appends a Read's response: the queue's offsets, the
// message count, the messages.
func appendReadResponse(dst []byte, oldest, next int64, msgs []*ferry.EnhancedMessage) []byte {
	dst = binary.AppendVarint(dst, oldest)
	dst = binary.AppendVarint(dst, next)
	dst = binary.AppendUvarint(dst, uint64(len(msgs)))
	for _, m := range msgs {
		dst = codec.Append(dst, m)
	}
	return dst
}

// decodeReadResponse reads a Read's response into dst: the queue's
// offsets, the message count (at most len(dst)), the messages.
func decodeReadResponse(b []byte, dst []*ferry.EnhancedMessage) (n int, oldest, next int64, err error) {
	r := &reader{b: b}
	oldest, next = r.varint("oldest offset"), r.varint("next offset")
	n = int(r.uvarint(uint64(len(dst)), "message count"))
	for i := range n {
		dst[i] = r.message()
	}
	if err := r.end(); err != nil {
		clear(dst[:n])
		return 0, 0, 0, err
	}
	return n, oldest, next, nil
}

// marshal is json.Marshal, its error wrapped as bad input.
func marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: remote: encode %T: %w", ferry.ErrInvalidOption, v, err)
	}
	return b, nil
}
