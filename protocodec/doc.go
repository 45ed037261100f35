// Package protocodec gives Ferry's typed messages protocol buffers
// bodies: [Codec] is a [ferry.BodyCodec] in the protobuf binary format,
// [JSON] one in the protobuf JSON mapping (protojson). It is a module of
// its own (github.com/ferrymq/ferry/protocodec), so the core module keeps
// no dependency on google.golang.org/protobuf.
//
//	orders, err := ferry.NewTypedProducer(p, ferry.WithBodyCodec(protocodec.Codec[*orderpb.Order]{}))
//	_, err = orders.Send(ctx, &ferry.TypedMessage[*orderpb.Order]{Topic: "orders", Key: id, Value: o})
//
//	c, err := b.NewConsumer("billing", "orders", ferry.TypedHandler(
//		func(ctx context.Context, o *orderpb.Order, m *ferry.EnhancedMessage) error { ... },
//		ferry.WithBodyCodec(protocodec.Codec[*orderpb.Order]{})))
//
// T is a generated message type, a pointer (*orderpb.Order): Decode
// makes a fresh one for each body, so a handler may keep the value. The
// typed wrappers refuse a nil one on both sides; a body that does not
// unmarshal is a permanent failure, dead-lettered with the error (see
// [ferry.TypedHandler]). T must be a concrete message type: with an
// interface (proto.Message itself) Decode cannot know what to make, and
// returns an error.
//
// Both codecs are safe for concurrent use, as a consumer needs.
package protocodec
