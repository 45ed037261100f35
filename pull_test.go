package ferry_test

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"sort"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The option families are types, so the compiler refuses an option to
// the kind of consumer it is not for: a GroupOption goes to both, a
// push-only option (a ConsumerOption and no more) only to NewConsumer,
// WithAutoCommit (a PullConsumerOption and no more) only to
// NewPullConsumer. The table gives each option's family; the reflection
// checks say which of the two constructors' variadic types it is.
var (
	_ ferry.GroupOption        = ferry.WithMemberID("m")
	_ ferry.ConsumerOption     = ferry.Ordered()
	_ ferry.PullConsumerOption = ferry.WithAutoCommit()
)

func TestOptionFamilies(t *testing.T) {
	push := reflect.TypeFor[ferry.ConsumerOption]()
	pull := reflect.TypeFor[ferry.PullConsumerOption]()
	for name, c := range map[string]struct {
		o          any
		push, pull bool
	}{
		"WithAllocator":       {ferry.WithAllocator(ferry.AllocateAveragely()), true, true},
		"Broadcast":           {ferry.Broadcast(), true, true},
		"WithMemberID":        {ferry.WithMemberID("m"), true, true},
		"WithBuffer":          {ferry.WithBuffer(1, 1), true, true},
		"WithWatermarks":      {ferry.WithWatermarks(1, 0), true, true},
		"WithMaxSpan":         {ferry.WithMaxSpan(1), true, true},
		"WithStartFrom":       {ferry.WithStartFrom(ferry.Latest), true, true},
		"WithTags":            {ferry.WithTags("a"), true, true},
		"WithDrainTimeout":    {ferry.WithDrainTimeout(0), true, true},
		"WithOnError":         {ferry.WithOnError(nil), true, true},
		"WithOnReset":         {ferry.WithOnReset(nil), true, true},
		"WithOnAssigned":      {ferry.WithOnAssigned(nil), true, true},
		"WithOnRevoked":       {ferry.WithOnRevoked(nil), true, true},
		"WithConsumerHooks":   {ferry.WithConsumerHooks(), true, true},
		"Ordered":             {ferry.Ordered(), true, false},
		"WithConcurrency":     {ferry.WithConcurrency(1), true, false},
		"WithRetry":           {ferry.WithRetry(1, 0), true, false},
		"WithMaxRetryBackoff": {ferry.WithMaxRetryBackoff(0), true, false},
		"WithDeadLetter":      {ferry.WithDeadLetter("x"), true, false},
		"WithAutoCommit":      {ferry.WithAutoCommit(), false, true},
	} {
		typ := reflect.TypeOf(c.o)
		assert.Equal(t, c.push, typ.Implements(push), "%s is a ConsumerOption (push)", name)
		assert.Equal(t, c.pull, typ.Implements(pull), "%s is a PullConsumerOption", name)
	}

	// The same GroupOptions configure both kinds.
	b := newTopic(t, 1)
	shared := []ferry.GroupOption{ferry.WithStartFrom(ferry.Latest), ferry.WithBuffer(8, 1<<20), ferry.WithTags("a")}
	var pushOpts []ferry.ConsumerOption
	var pullOpts []ferry.PullConsumerOption
	for _, o := range shared {
		pushOpts = append(pushOpts, o)
		pullOpts = append(pullOpts, o)
	}
	c, err := b.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }), append(pushOpts, ferry.Ordered())...)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	pc, err := b.NewPullConsumer("g", "t", append(pullOpts, ferry.WithAutoCommit())...)
	require.NoError(t, err)
	require.NoError(t, pc.Close())

	// A nil option, of either family, is skipped.
	var none ferry.GroupOption
	c, err = b.NewConsumer("g", "t", ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil }), none, nil)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	pc, err = b.NewPullConsumer("g", "t", none, nil)
	require.NoError(t, err)
	require.NoError(t, pc.Close())
}

// ExamplePullConsumer_Poll pulls messages and commits them.
func ExamplePullConsumer_Poll() {
	ctx := context.Background()
	b, _ := ferry.NewBroker()
	defer b.Close()
	_ = b.CreateTopic(ctx, ferry.TopicMeta{Name: "events", Queues: 1})
	p, _ := b.NewProducer()
	for i := range 3 {
		_, _ = p.Send(ctx, &ferry.Message{Topic: "events", Body: fmt.Appendf(nil, "event %d", i)})
	}

	pc, err := b.NewPullConsumer("audit", "events")
	if err != nil {
		panic(err)
	}
	defer pc.Close()
	var bodies []string
	for len(bodies) < 3 {
		msgs, err := pc.Poll(ctx, 10)
		if err != nil {
			panic(err)
		}
		for _, m := range msgs {
			bodies = append(bodies, string(m.Body))
		}
		if err := pc.Commit(ctx, msgs...); err != nil {
			panic(err)
		}
	}
	sort.Strings(bodies)
	fmt.Println(bodies)
	// Output:
	// [event 0 event 1 event 2]
}

// A huge max is no reason to allocate: Poll returns what one queue holds.
func TestPullConsumerPollHugeMax(t *testing.T) {
	b := newTopic(t, 1)
	produce(t, b, "t", "x", 10, 1)
	pc, err := b.NewPullConsumer("g", "t", ferry.WithBuffer(4, 1<<20))
	require.NoError(t, err)
	defer pc.Close()
	got := 0
	for got < 10 {
		msgs, err := pc.Poll(context.Background(), math.MaxInt)
		require.NoError(t, err)
		require.NotEmpty(t, msgs)
		require.LessOrEqual(t, len(msgs), 4, "no more than the buffer holds")
		require.NoError(t, pc.Commit(context.Background(), msgs...))
		got += len(msgs)
	}
	assert.Equal(t, 10, got)
}
