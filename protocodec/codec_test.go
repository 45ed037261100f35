package protocodec_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/protocodec"
)

// Both codecs round-trip generated messages of the well-known types, each
// Decode a fresh message.
func TestRoundTrip(t *testing.T) {
	st, err := structpb.NewStruct(map[string]any{"customer": "alice", "total": 12.5, "lines": []any{"a", "b"}})
	require.NoError(t, err)
	ts := timestamppb.New(time.Date(2026, 12, 2, 6, 0, 0, 123, time.UTC))
	sv := wrapperspb.String("héllo")

	t.Run("binary", func(t *testing.T) {
		roundTrip(t, protocodec.Codec[*structpb.Struct]{Marshal: proto.MarshalOptions{Deterministic: true}}, st)
		roundTrip(t, protocodec.Codec[*timestamppb.Timestamp]{}, ts)
		roundTrip(t, protocodec.Codec[*wrapperspb.StringValue]{}, sv)
	})
	t.Run("json", func(t *testing.T) {
		roundTrip(t, protocodec.JSON[*structpb.Struct]{}, st)
		roundTrip(t, protocodec.JSON[*timestamppb.Timestamp]{}, ts)
		roundTrip(t, protocodec.JSON[*wrapperspb.StringValue]{}, sv)
		body, err := protocodec.JSON[*timestamppb.Timestamp]{}.Encode(ts)
		require.NoError(t, err)
		assert.Equal(t, `"2026-12-02T06:00:00.000000123Z"`, string(body))
	})
}

func roundTrip[T proto.Message](t *testing.T, c ferry.BodyCodec[T], v T) {
	t.Helper()
	body, err := c.Encode(v)
	require.NoError(t, err)
	got, err := c.Decode(body)
	require.NoError(t, err)
	assert.True(t, proto.Equal(v, got), "%T: got %v, want %v", c, got, v)
	again, err := c.Decode(body)
	require.NoError(t, err)
	assert.NotSame(t, any(got), any(again), "a fresh message each time")
}

// Bytes that are not the message are an error, not a panic; so is an
// interface T, which gives Decode nothing to make.
func TestDecodeErrors(t *testing.T) {
	_, err := protocodec.Codec[*wrapperspb.StringValue]{}.Decode([]byte{0xff, 0xff})
	assert.Error(t, err)
	_, err = protocodec.JSON[*wrapperspb.StringValue]{}.Decode([]byte(`{"value":`))
	assert.Error(t, err)
	_, err = protocodec.JSON[*timestamppb.Timestamp]{}.Decode([]byte(`"yesterday"`))
	assert.Error(t, err)
	_, err = protocodec.Codec[proto.Message]{}.Decode(nil)
	assert.ErrorContains(t, err, "protocodec: cannot decode into protoreflect.ProtoMessage, an interface type")
	_, err = protocodec.JSON[proto.Message]{}.Decode(nil)
	assert.ErrorContains(t, err, "interface type")
}

// newBroker returns a broker holding topic "t" of one queue.
func newBroker(t *testing.T) *ferry.Broker {
	t.Helper()
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: "t", Queues: 1}))
	return b
}

// Through a broker: protobuf values sent with a TypedProducer reach a
// TypedHandler equal, with their keys; a body that is not the message is
// dead-lettered at once with protobuf's error, the handler never called.
func TestThroughBroker(t *testing.T) {
	ctx := t.Context()
	b := newBroker(t)
	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	codec := ferry.WithBodyCodec(protocodec.Codec[*timestamppb.Timestamp]{})
	tp, err := ferry.NewTypedProducer(p, codec)
	require.NoError(t, err)

	var mu sync.Mutex
	got := map[string]*timestamppb.Timestamp{}
	wake := make(chan struct{}, 1)
	c, err := b.NewConsumer("g", "t", ferry.TypedHandler(func(_ context.Context, v *timestamppb.Timestamp, m *ferry.EnhancedMessage) error {
		mu.Lock()
		got[m.Key] = v
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
		return nil
	}, codec))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Close()

	start := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	want := map[string]*timestamppb.Timestamp{}
	var batch []*ferry.TypedMessage[*timestamppb.Timestamp]
	for i := range 10 {
		key := "k" + strconv.Itoa(i)
		want[key] = timestamppb.New(start.Add(time.Duration(i) * time.Second))
		batch = append(batch, &ferry.TypedMessage[*timestamppb.Timestamp]{Topic: "t", Key: key, Value: want[key]})
	}
	_, err = tp.SendBatch(ctx, batch[:5])
	require.NoError(t, err)
	for _, m := range batch[5:] {
		_, err := tp.Send(ctx, m)
		require.NoError(t, err)
	}
	_, err = tp.Send(ctx, &ferry.TypedMessage[*timestamppb.Timestamp]{Topic: "t"})
	assert.ErrorIs(t, err, ferry.ErrInvalidMessage, "a nil message value")
	_, err = p.Send(ctx, &ferry.Message{Topic: "t", Key: "bad", Body: []byte{0xff, 0xff}})
	require.NoError(t, err)

	deadline := time.After(time.Minute)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == len(want) && c.Stats().DeadLettered == 1 {
			break
		}
		select {
		case <-wake:
		case <-time.After(time.Millisecond):
		case <-deadline:
			t.Fatalf("%d of %d values, %d dead letters", n, len(want), c.Stats().DeadLettered)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, v := range want {
		assert.True(t, proto.Equal(v, got[k]), "%s", k)
	}
	assert.NotContains(t, got, "bad")

	pc, err := b.NewPullConsumer("reader", "%DLQ%g")
	require.NoError(t, err)
	defer pc.Close()
	msgs, err := pc.Poll(ctx, 10)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "bad", msgs[0].Key)
	assert.Equal(t, "1", msgs[0].Headers[ferry.HeaderAttempts])
	assert.Contains(t, msgs[0].Headers[ferry.HeaderError], "ferry: decode t[0] offset 10 with protocodec.Codec[*google.golang.org/protobuf/types/known/timestamppb.Timestamp]: invalid message: ")
	assert.Contains(t, msgs[0].Headers[ferry.HeaderError], "proto")
}
