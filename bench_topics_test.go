package ferry_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/ferrymq/ferry"
)

// BenchmarkCreateTopics creates 10,000 topics of one queue on a broker:
// one op is the whole 10,000.
func BenchmarkCreateTopics(b *testing.B) {
	ctx := context.Background()
	names := make([]string, 10000)
	for i := range names {
		names[i] = "topic-" + strconv.Itoa(i)
	}
	for b.Loop() {
		br, err := ferry.NewBroker()
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range names {
			if err := br.CreateTopic(ctx, ferry.TopicMeta{Name: n, Queues: 1}); err != nil {
				b.Fatal(err)
			}
		}
		_ = br.Close()
	}
}
