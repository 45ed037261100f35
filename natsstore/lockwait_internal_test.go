package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// quietWatcher is a lock key's watch with nothing more to say.
type quietWatcher struct{ ch chan jetstream.KeyValueEntry }

func (w quietWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.ch }
func (w quietWatcher) Stop() error                             { return nil }

// TestAwaitFreeAfterRefusedCreate: a Lock whose create was refused after
// its watch had seen the key deleted tries again shortly instead of
// waiting on the watch, which has nothing more to say, for the TTL. (It
// waited: TestCluster/Coordinator/Wake failed under load, 1 TestCluster
// in 20, "Lock still waiting 1s after the lock was freed".)
func TestAwaitFreeAfterRefusedCreate(t *testing.T) {
	s := &session{c: &Coordinator{cfg: config{ttl: time.Hour}}, stop: make(chan struct{})}
	w := quietWatcher{make(chan jetstream.KeyValueEntry)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // far below the TTL
	defer cancel()
	v := keyView{known: true} // the watch's initial values are in, the key was deleted
	require.NoError(t, s.awaitFree(ctx, w, &v), "a wait on a key the watch saw free")
	require.Equal(t, keyView{known: true}, v)
}
