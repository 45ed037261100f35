package ferry_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/ferrymq/ferry"
)

// BenchmarkRebalance times a member joining a group of 7 over 256 queues
// until it holds its 32 (the others release theirs first), then leaving
// until they hold all 256 again: one op is one join and one leave.
func BenchmarkRebalance(b *testing.B) {
	ctx := context.Background()
	br, err := ferry.NewBroker()
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: "t", Queues: 256}); err != nil {
		b.Fatal(err)
	}
	noop := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })
	var members []*ferry.Consumer
	for i := range 7 {
		c, err := br.NewConsumer("g", "t", noop, ferry.WithMemberID("m"+strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			b.Fatal(err)
		}
		members = append(members, c)
	}
	defer func() {
		for _, c := range members {
			_ = c.Close()
		}
	}()
	settled := func(want int) {
		for {
			n := 0
			for _, c := range members {
				n += len(c.Assigned())
			}
			if n == want {
				return
			}
		}
	}
	settled(256)
	b.ResetTimer()
	for b.Loop() {
		c, err := br.NewConsumer("g", "t", noop, ferry.WithMemberID("joiner"))
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if err := c.Close(); err != nil {
			b.Fatal(err)
		}
		settled(256)
	}
}
