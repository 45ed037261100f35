package natsstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// A queue's writes: publishes, atomic batches, their duplicates, and what
// was stored when an answer was lost.

// Write implements [ferry.Queue]. One message is a publish with
// Nats-Msg-Id set to its [ferry.MessageID] (or, with a dedup key, to the
// key's: see DedupWindow and dedup.go); several are one atomic batch (at
// most [MaxBatch]), each keyed message with its key's ID and the first
// without a key with its own (see natsMsg). A try whose outcome
// is unknown (a timeout after sending, no responders while a leader is
// elected) is repeated with the same IDs until ctx ends: a single message
// the stream stored already is dropped as a duplicate and its offset
// returned; a batch it stored already is refused (duplicate message ID),
// and Write finds its first message from the stream's end known before the
// first try (a batch with keys, from the last copy of each key). So a
// retried Write neither duplicates nor loses within the stream's
// duplicate window. If ctx ends while the outcome is unknown,
// Write returns ctx's error and the batch may have been stored: write the
// same messages again to learn their offset.
func (q *queue) Write(ctx context.Context, msgs []*ferry.EnhancedMessage) (int64, error) {
	if err := checkContext(ctx); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: err}
	}
	return q.write(ctx, msgs, true)
}

// TryWrite implements [ferry.TryWriter]: Write without waiting for room,
// bounded by the op timeout.
func (q *queue) TryWrite(msgs []*ferry.EnhancedMessage) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), q.s.cfg.opTimeout)
	defer cancel()
	return q.write(ctx, msgs, false)
}

func (q *queue) write(ctx context.Context, msgs []*ferry.EnhancedMessage, wait bool) (int64, error) {
	if q.isClosed() {
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: ferry.ErrClosed}
	}
	size := int64(0)
	for i, m := range msgs {
		if m == nil {
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: fmt.Errorf("%w: message %d is nil", ferry.ErrInvalidMessage, i)}
		}
		size += int64(m.Size())
	}
	r := q.meta.Retention
	switch {
	case len(msgs) > MaxBatch:
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: fmt.Errorf("%w: batch of %d messages, at most %d", ferry.ErrMessageTooLarge, len(msgs), MaxBatch)}
	case r.MaxMessages > 0 && int64(len(msgs)) > r.MaxMessages:
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: fmt.Errorf("%w: batch of %d messages, retention %d", ferry.ErrMessageTooLarge, len(msgs), r.MaxMessages)}
	case r.MaxBytes > 0 && size > r.MaxBytes:
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: fmt.Errorf("%w: batch of %d bytes, retention %d", ferry.ErrMessageTooLarge, size, r.MaxBytes)}
	}
	if err := ctx.Err(); err != nil {
		return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: err}
	}
	if len(msgs) == 0 {
		if err := q.refresh(ctx); err != nil {
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: err}
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.next, nil
	}
	q.mu.Lock()
	hint := q.next // the batch lands after this
	q.mu.Unlock()
	p := q.newPlan(msgs, time.Now().UnixNano())
	unknown := false // a try's outcome was unknown: the stream may hold p
	for {
		if len(p.keep) == 0 { // every message a duplicate
			p.settle()
			q.mu.Lock()
			defer q.mu.Unlock()
			return q.next, nil
		}
		tctx, tcancel := context.WithTimeout(ctx, q.s.cfg.opTimeout) // one try
		last, dup, err := q.publish(tctx, p.out)
		tcancel()
		if err == nil && dup {
			// Stored by an earlier try (give back its store time too), or
			// a duplicate of another write's.
			ours, serr := q.settleSingle(ctx, p, last, unknown)
			if serr != nil {
				err = serr // a timeout: asked again below
			} else if !ours {
				continue
			}
		}
		if err == nil {
			first := last - int64(len(p.keep)) + 1
			p.stored(first)
			q.advance(last + 1)
			return first, nil
		}
		switch {
		case isDuplicateBatch(err):
			ours, first, ferr := q.resolveBatch(ctx, p, hint, unknown)
			switch {
			case ferr != nil && !p.keyed:
				return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s: a retried batch was stored before, finding it", q.id), Err: ferr}
			case ferr != nil:
				return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s: a batch holds a key stored before, finding it", q.id), Err: ferr}
			case ours:
				return first, nil
			}
		case isFull(err) && !wait:
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: ferry.ErrQueueFull}
		case isFull(err):
			if werr := q.waitRoom(ctx); werr != nil {
				return 0, werr
			}
		case isTooLarge(err):
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: fmt.Errorf("%w: %v", ferry.ErrMessageTooLarge, err)}
		case q.isClosed():
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: ferry.ErrClosed}
		case ctx.Err() != nil:
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s: outcome unknown (%v)", q.id, err), Err: ctx.Err()}
		case isAmbiguous(err) || isDupInProcess(err):
			unknown = true
			select {
			case <-time.After(retryBackoff):
			case <-ctx.Done():
			case <-q.done:
			}
		default:
			return 0, &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: err}
		}
	}
}

// publish stores out and returns the offset of its last message; dup
// says a single message was stored before (and dropped now).
func (q *queue) publish(ctx context.Context, out []*nats.Msg) (last int64, dup bool, err error) {
	if len(out) == 1 {
		ack, err := q.s.js.PublishMsg(ctx, out[0])
		if err != nil {
			return 0, false, err
		}
		return int64(ack.Sequence) - 1, ack.Duplicate, nil
	}
	// PublishMsgBatch rewrites the batch headers: give it copies.
	cp := make([]*nats.Msg, len(out))
	for i, m := range out {
		h := make(nats.Header, 4)
		if id, ok := m.Header[jetstream.MsgIDHeader]; ok { // the first unkeyed and the keyed (see natsMsg)
			h[jetstream.MsgIDHeader] = id
		}
		cp[i] = &nats.Msg{Subject: m.Subject, Header: h, Data: m.Data}
	}
	// No flow control: the first message is not a request of its own.
	// The commit's answer tells the outcome of the whole batch (an
	// earlier message refused makes it incomplete: nothing stored).
	ack, err := jetstreamext.PublishMsgBatch(ctx, q.s.js, cp, jetstreamext.BatchFlowControl{})
	if err != nil {
		return 0, false, err
	}
	return int64(ack.Sequence) - 1, false, nil
}

// locate finds the offset and StoreUnixNano of the message published
// with Nats-Msg-Id msgID and of ID id: first after offset hint (the
// stream's end before a Write's first try), then, with window, for a
// batch written again by a later Write, over the duplicate window (the
// stream dropped it as a duplicate, so it is stored within it).
func (q *queue) locate(ctx context.Context, hint int64, msgID string, id ferry.MessageID, window bool) (int64, int64, error) {
	off, at, err := q.find(ctx, msgID, id, jetstreamext.GetBatchSeq(uint64(hint)+1))
	if err == nil || !errors.Is(err, errNotFound) || !window {
		return off, at, err
	}
	return q.find(ctx, msgID, id, jetstreamext.GetBatchStartTime(time.Now().Add(-q.sc.Duplicates-time.Minute)))
}

var errNotFound = errors.New("not found")

func (q *queue) find(ctx context.Context, msgID string, id ferry.MessageID, from jetstreamext.GetBatchOpt) (int64, int64, error) {
	for {
		it, err := jetstreamext.GetBatch(ctx, q.s.js, q.stream, readBatch, from)
		if err != nil {
			return 0, 0, err
		}
		got := 0
		for raw, err := range it {
			if err != nil {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					break
				}
				return 0, 0, err
			}
			got++
			if raw.Header.Get(jetstream.MsgIDHeader) == msgID {
				m, _, err := codec.Decode(raw.Data)
				if err != nil {
					return 0, 0, err
				}
				if m.ID == id {
					return int64(raw.Sequence) - 1, m.StoreUnixNano, nil
				}
			}
			from = jetstreamext.GetBatchSeq(raw.Sequence + 1)
		}
		if got == 0 {
			return 0, 0, fmt.Errorf("message %s: %w", id, errNotFound)
		}
	}
}

// waitRoom waits for a Release (here or in another process), ctx or
// Close. A release by age or by a process that died before telling is
// caught by a retry every second.
func (q *queue) waitRoom(ctx context.Context) error {
	select {
	case <-q.relWake:
		return nil
	case <-time.After(time.Second):
		return nil
	case <-q.done:
		return &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: ferry.ErrClosed}
	case <-ctx.Done():
		return &ferry.Error{Op: fmt.Sprintf("natsstore: write %s", q.id), Err: ctx.Err()}
	}
}

func apiCode(err error) (jetstream.ErrorCode, string) {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.ErrorCode, api.Description
	}
	var jserr jetstream.JetStreamError
	if errors.As(err, &jserr) && jserr.APIError() != nil {
		return jserr.APIError().ErrorCode, jserr.APIError().Description
	}
	return 0, ""
}

func isDuplicateBatch(err error) bool {
	code, _ := apiCode(err)
	return code == jetstreamext.JSErrCodeBatchPublishDuplicateMsgID
}

func isFull(err error) bool {
	_, desc := apiCode(err)
	s := desc + " " + err.Error()
	return strings.Contains(s, "maximum messages exceeded") || strings.Contains(s, "maximum bytes exceeded")
}

func isTooLarge(err error) bool {
	code, _ := apiCode(err)
	return errors.Is(err, nats.ErrMaxPayload) || code == 10054 ||
		code == jetstreamext.JSErrCodeBatchPublishExceedsLimit
}

// isAmbiguous: the write may or may not have been stored, or was not
// stored for a passing reason; trying again is safe.
func isAmbiguous(err error) bool {
	code, _ := apiCode(err)
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		code == jetstreamext.JSErrCodeAtomicPublishTooManyInflight || code == jetstreamext.JSErrCodeBatchPublishTooManyInflight ||
		code == jetstreamext.JSErrCodeBatchPublishIncomplete /* abandoned: nothing stored */ ||
		code == 10008 /* cluster not available */
}
