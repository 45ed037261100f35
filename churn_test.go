package ferry_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Members join and leave the group while messages are produced: each
// churn step follows a produced batch, so membership changes every few
// milliseconds. Nothing may be lost. Duplicates can only come from
// messages in flight when a member gave a queue up without finishing them
// (the drain timeout); with handlers far faster than the drain timeout,
// every release drains fully, so there must be none.
func TestConsumerChurnLosesNothing(t *testing.T) {
	batches, perBatch := 400, 25
	if testing.Short() {
		batches = 60
	}
	n := batches * perBatch
	b := newTopic(t, 8)
	c := newTally(n)

	steps := make(chan int)
	stepped := make(chan struct{})
	churned := make(chan []*ferry.Consumer)
	go func() {
		var live []*ferry.Consumer
		seq := 0
		for step := range steps {
			if len(live) < 2 || (step%3 != 0 && len(live) < 5) {
				seq++
				cn, err := b.NewConsumer("g", "t", c.handler(), ferry.WithMemberID("m"+strconv.Itoa(seq)), ferry.WithConcurrency(2))
				if assert.NoError(t, err) && assert.NoError(t, cn.Start(context.Background())) {
					live = append(live, cn)
				}
			} else {
				assert.NoError(t, live[0].Close())
				live = live[1:]
			}
			stepped <- struct{}{}
		}
		churned <- live
	}()

	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	for i := range batches {
		msgs := make([]*ferry.Message, perBatch)
		for j := range msgs {
			k := i*perBatch + j
			msgs[j] = &ferry.Message{Topic: "t", Key: "k" + strconv.Itoa(k%97), Body: []byte("m" + strconv.Itoa(k))}
		}
		_, err := p.SendBatch(context.Background(), msgs)
		require.NoError(t, err)
		steps <- i // one join or leave between every two batches
		<-stepped
	}
	close(steps)
	live := <-churned
	require.NotEmpty(t, live)
	c.waitAll(t)
	for _, cn := range live {
		require.NoError(t, cn.Close())
	}
	assert.Equal(t, n, c.distinct(), "nothing lost")
	assert.Zero(t, c.duplicates(), "fully drained releases redeliver nothing")
}
