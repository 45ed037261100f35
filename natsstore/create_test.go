package natsstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestConcurrentCreate: three processes (three connections, three Stores
// of one deployment) start at once and create the same topic of R3 queues,
// as a broker does (CreateTopic, then OpenQueue of every queue), with the
// default op timeout: all succeed, agree on the topic, and a message
// written through one is read through the others.
func TestConcurrentCreate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no cluster")
	}
	c := tripleServer(t)
	prefix := fmt.Sprintf("cc%d", fresh.Add(1))
	dropDeployment(t, c, prefix)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	meta := ferry.TopicMeta{Name: "dead.letters", Queues: 2}
	const procs = 3
	stores := make([]*natsstore.Store, procs)
	queues := make([][]ferry.Queue, procs)
	errs := make([]error, procs)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for p := range procs {
		js := c.connect(t)
		wg.Go(func() {
			<-start
			st, err := natsstore.Open(ctx, js, natsstore.WithPrefix(prefix), natsstore.WithReplicas(3))
			if err != nil {
				errs[p] = fmt.Errorf("open: %w", err)
				return
			}
			stores[p] = st
			if err := st.CreateTopic(ctx, meta); err != nil {
				errs[p] = fmt.Errorf("create topic: %w", err)
				return
			}
			for i := range meta.Queues {
				q, err := st.OpenQueue(ctx, meta, i)
				if err != nil {
					errs[p] = fmt.Errorf("open queue %d: %w", i, err)
					return
				}
				queues[p] = append(queues[p], q)
			}
		})
	}
	close(start)
	wg.Wait()
	defer func() {
		for _, st := range stores {
			if st != nil {
				_ = st.Close()
			}
		}
	}()
	for p, err := range errs {
		require.NoError(t, err, "process %d", p)
	}
	for p, st := range stores {
		have, err := st.Topic(ctx, meta.Name)
		require.NoError(t, err, "process %d", p)
		require.Equal(t, meta.Normalized(), have.Normalized(), "process %d", p)
	}
	for i := range meta.Queues {
		first, err := queues[0][i].Write(ctx, newMsgs(meta.Name, 3))
		require.NoError(t, err)
		for p := 1; p < procs; p++ {
			// A Read returns at least one message, maybe fewer than there
			// are (the contract): read until all three came.
			got := 0
			for got < 3 {
				dst := make([]*ferry.EnhancedMessage, 3-got)
				n, err := queues[p][i].Read(ctx, first+int64(got), dst)
				require.NoError(t, err, "process %d queue %d", p, i)
				for k := range n {
					require.Equal(t, first+int64(got+k), dst[k].Offset, "process %d queue %d", p, i)
				}
				got += n
			}
		}
	}
}
