package protocodec_test

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/protocodec"
)

func ExampleCodec() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "orders", Queues: 1})
	p, _ := b.NewProducer()
	defer p.Close()
	codec := ferry.WithBodyCodec(protocodec.Codec[*structpb.Struct]{})
	orders, _ := ferry.NewTypedProducer(p, codec)

	got := make(chan string, 1)
	c, _ := b.NewConsumer("billing", "orders", ferry.TypedHandler(
		func(ctx context.Context, o *structpb.Struct, m *ferry.EnhancedMessage) error {
			got <- fmt.Sprintf("%s: %v", m.Key, o.AsMap()["total"])
			return nil
		}, codec))
	_ = c.Start(ctx)
	defer c.Close()

	o, _ := structpb.NewStruct(map[string]any{"customer": "alice", "total": 12.5})
	if _, err := orders.Send(ctx, &ferry.TypedMessage[*structpb.Struct]{Topic: "orders", Key: "alice", Value: o}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-got)
	// Output:
	// alice: 12.5
}
