package protocodec

import (
	"fmt"
	"reflect"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ferrymq/ferry"
)

// Codec is the [ferry.BodyCodec] of a protobuf message type T in the
// binary wire format. Its zero value uses proto's default options; set
// Marshal (Deterministic, say) or Unmarshal (DiscardUnknown...) to
// change them.
type Codec[T proto.Message] struct {
	Marshal   proto.MarshalOptions
	Unmarshal proto.UnmarshalOptions
}

var _ ferry.BodyCodec[proto.Message] = Codec[proto.Message]{}

// Encode returns the wire encoding of v.
func (c Codec[T]) Encode(v T) ([]byte, error) { return c.Marshal.Marshal(v) }

// Decode returns a new T holding the message body encodes.
func (c Codec[T]) Decode(body []byte) (T, error) {
	v, err := newMessage[T]()
	if err != nil {
		return v, err
	}
	if err := c.Unmarshal.Unmarshal(body, v); err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// JSON is the [ferry.BodyCodec] of a protobuf message type T in the
// protobuf JSON mapping (package protojson): readable bodies, at the
// cost of size and speed. Its zero value uses protojson's default
// options.
type JSON[T proto.Message] struct {
	Marshal   protojson.MarshalOptions
	Unmarshal protojson.UnmarshalOptions
}

var _ ferry.BodyCodec[proto.Message] = JSON[proto.Message]{}

// Encode returns the JSON encoding of v.
func (c JSON[T]) Encode(v T) ([]byte, error) { return c.Marshal.Marshal(v) }

// Decode returns a new T holding the message body encodes.
func (c JSON[T]) Decode(body []byte) (T, error) {
	v, err := newMessage[T]()
	if err != nil {
		return v, err
	}
	if err := c.Unmarshal.Unmarshal(body, v); err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// newMessage returns a new, empty T: what a nil T's reflection makes
// (generated types answer ProtoReflect on a nil pointer). An interface T
// has no type to make.
func newMessage[T proto.Message]() (T, error) {
	var zero T
	if any(zero) == nil {
		return zero, fmt.Errorf("protocodec: cannot decode into %s, an interface type: use a concrete message type", reflect.TypeFor[T]())
	}
	return zero.ProtoReflect().New().Interface().(T), nil
}
