package ferry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
)

// Errors are composed, not rewritten: each reads with one "ferry:", the
// operations in order, and the text of an error that is not Ferry's (a
// user's, here) exactly as it went in, even when it holds "ferry:".
func TestErrorsComposed(t *testing.T) {
	ctx := context.Background()
	b := newTopic(t, 2)
	userErr := errors.New("db: ferry: tables")
	p, err := b.NewProducer(ferry.WithRouter(ferry.RouterFunc(func(*ferry.EnhancedMessage, ferry.TopicMeta) (int, error) {
		return 0, userErr
	})))
	require.NoError(t, err)
	defer p.Close()

	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, ferry.ErrInvalidRoute)
	require.ErrorIs(t, err, userErr)
	assert.Equal(t, "ferry: send: invalid route: router ferry.RouterFunc failed: db: ferry: tables", err.Error())
	var fe *ferry.Error
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "send", fe.Op)

	_, err = p.Send(ctx, &ferry.Message{Topic: "nope", Body: []byte("x")})
	require.ErrorIs(t, err, ferry.ErrTopicNotFound)
	assert.Equal(t, `ferry: send: topic: topic not found: "nope"`, err.Error())

	err = b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 3})
	require.ErrorIs(t, err, ferry.ErrTopicExists)
	assert.Regexp(t, `^ferry: create topic "t": topic exists with different metadata: have .*, asked .*$`, err.Error())

	q := ferry.NewMemoryQueue(ferry.QueueID{Topic: "t"}, ferry.Retention{})
	require.NoError(t, q.Close())
	_, err = q.Write(ctx, []*ferry.EnhancedMessage{{}})
	assert.Equal(t, "ferry: write t[0]: closed", err.Error())
	_, err = q.Read(ctx, 0, make([]*ferry.EnhancedMessage, 1))
	assert.Equal(t, "ferry: read t[0]: closed", err.Error())

	require.NoError(t, p.Close())
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, ferry.ErrClosed)
	assert.Equal(t, "ferry: send: closed", err.Error())
}

// A store's error inside the broker's reads with one prefix: the store's
// own *Error nests without repeating it.
func TestErrorsNestStoreErrors(t *testing.T) {
	ctx := context.Background()
	storeErr := &ferry.Error{Op: "mystore: write t[0]", Err: errors.New("disk full")}
	st := &failingStorage{MemoryStorage: ferry.NewMemoryStorage(), err: storeErr}
	b, err := ferry.NewBroker(ferry.WithStorage(st))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 1}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, storeErr)
	assert.Equal(t, "ferry: send: mystore: write t[0]: disk full", err.Error())
}

// failingStorage opens queues whose writes fail with err.
type failingStorage struct {
	*ferry.MemoryStorage
	err error
}

func (s *failingStorage) OpenQueue(ctx context.Context, meta ferry.TopicMeta, i int) (ferry.Queue, error) {
	q, err := s.MemoryStorage.OpenQueue(ctx, meta, i)
	if err != nil {
		return nil, err
	}
	return failingQueue{q, s.err}, nil
}

type failingQueue struct {
	ferry.Queue
	err error
}

func (q failingQueue) Write(context.Context, []*ferry.EnhancedMessage) (int64, error) {
	return 0, q.err
}

// A handler's error reaches the dead-letter header as the handler wrote it.
func TestErrorsUserTextKept(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "m", 1, 1)
	startConsumer(t, b, "g", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error {
		return ferry.Permanent(errors.New("db: ferry: tables"))
	}))
	pc, err := b.NewPullConsumer("dlq-reader", "%DLQ%g")
	require.NoError(t, err)
	defer pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := pc.Poll(ctx, 1)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "db: ferry: tables", msgs[0].Headers[ferry.HeaderError])
}
