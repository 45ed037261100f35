package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/natsstore"
	"github.com/nats-io/nats.go/jetstream"
)

var fresh atomic.Int64

// features of natsstore for the suites: persistent, fencing tokens in the
// bucket; not RetentionExact (JetStream counts bytes its own way and ages
// on the server's clock), Block supported.
var features = ferrytest.Features{Persistent: true, TokensPersist: true, Block: true, Dedup: true, Timeout: 20 * time.Second}

func openStore(t *testing.T, c *cluster, prefix string, opts ...natsstore.Option) *natsstore.Store {
	t.Helper()
	js := c.connect(t)
	opts = append([]natsstore.Option{natsstore.WithPrefix(prefix)}, opts...)
	if len(c.servers) == 3 {
		opts = append(opts, natsstore.WithReplicas(3))
	}
	s, err := natsstore.Open(context.Background(), js, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runSuites runs the Queue, Storage and CursorStore suites on c. Each
// subtest's deployment is dropped when it ends (see dropDeployment): the
// servers live as long as the process, and with -count=20 the streams
// and buckets left behind (thousands, each a Raft group on the cluster)
// slowed every request past the op timeout.
func runSuites(t *testing.T, c *cluster) {
	opts := suiteOpts(c)
	t.Run("Queue", func(t *testing.T) {
		ferrytest.TestQueue(t, features, func(t *testing.T, meta ferry.TopicMeta, i int) ferry.Queue {
			prefix := fmt.Sprintf("q%d", fresh.Add(1))
			dropDeployment(t, c, prefix) // after the store's and the suite's cleanups
			s := openStore(t, c, prefix, opts...)
			t.Cleanup(func() { _ = s.Close() })
			q, err := s.OpenQueue(context.Background(), meta, i)
			if err != nil {
				t.Fatal(err)
			}
			return q
		})
	})
	t.Run("Storage", func(t *testing.T) {
		ferrytest.TestStorage(t, features, func(t *testing.T, dir string) ferry.Storage {
			dropDeployment(t, c, prefixFor(dir)) // a reopen within the subtest finds it
			return openStore(t, c, prefixFor(dir), opts...)
		})
	})
	t.Run("CursorStore", func(t *testing.T) {
		ferrytest.TestCursorStore(t, features, func(t *testing.T, dir string) ferry.CursorStore {
			dropDeployment(t, c, prefixFor(dir))
			return openStore(t, c, prefixFor(dir), opts...)
		})
	})
}

func TestSingle(t *testing.T) { runSuites(t, singleServer(t)) }

// suiteOpts are the options of the stores and coordinators the
// conformance suites open on c: on the cluster, an op timeout of 10 s.
// Under -race on two loaded cores, creating an R3 stream or bucket (a
// Raft group elected among three servers in this process) took up to a
// second a try, longer with several at once (Storage/Concurrent), and
// the default 2 s failed Opens and OpenQueues with "context deadline
// exceeded". The suites check behaviour, not latency; the failover
// tests, which rely on short tries, keep the default.
func suiteOpts(c *cluster) []natsstore.Option {
	if len(c.servers) == 3 {
		return []natsstore.Option{natsstore.WithOpTimeout(10 * time.Second)}
	}
	return nil
}

// suiteTTL is the TTL of the suites' coordinators. The suites expire a
// member with DeleteMember, not by waiting, so it only bounds how long
// a renewal may take: with 2 s, sessions and leases counted themselves
// lost (0.8 × TTL without a renewal) when a loaded machine answered
// slower, in 5 of 20 TestCluster runs ("Lock …: session expired" in
// ConcurrentLocks, "member m1 of a stable group lost queue t[3]" in
// ExactlyOnceStableGroup, under a load average of 14).
const suiteTTL = 5 * time.Second

func openCoordinator(t *testing.T, c *cluster, prefix string, opts ...natsstore.Option) *natsstore.Coordinator {
	t.Helper()
	js := c.connect(t)
	opts = append([]natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithTTL(suiteTTL)}, opts...)
	if len(c.servers) == 3 {
		opts = append(opts, natsstore.WithReplicas(3))
	}
	co, err := natsstore.NewCoordinator(context.Background(), js, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return co
}

func runCoordinatorSuite(t *testing.T, c *cluster) {
	opts := suiteOpts(c)
	var prefixes sync.Map // *natsstore.Coordinator -> its prefix, for Peer
	f := ferrytest.CoordinatorFeatures{
		Timeout: 20 * time.Second,
		Expire: func(co ferry.Coordinator, g ferry.GroupKey, member string) {
			if err := natsstore.DeleteMember(context.Background(), co.(*natsstore.Coordinator), g, member); err != nil {
				panic(err)
			}
		},
		// Another broker's: a coordinator of the same prefix over a
		// connection of its own.
		Peer: func(t *testing.T, co ferry.Coordinator) ferry.Coordinator {
			prefix, ok := prefixes.Load(co)
			if !ok {
				t.Fatalf("no prefix for coordinator %p", co)
			}
			return openCoordinator(t, c, prefix.(string), opts...)
		},
	}
	ferrytest.TestCoordinator(t, f, func(t *testing.T) ferry.Coordinator {
		prefix := fmt.Sprintf("c%d", fresh.Add(1))
		dropDeployment(t, c, prefix) // as in runSuites
		co := openCoordinator(t, c, prefix, opts...)
		prefixes.Store(co, prefix)
		return co
	})
}

func TestSingleCoordinator(t *testing.T) { runCoordinatorSuite(t, singleServer(t)) }

// TestCluster runs the suites on an embedded 3-node cluster with R3
// streams and buckets.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no cluster")
	}
	c := tripleServer(t)
	runSuites(t, c)
	t.Run("Coordinator", func(t *testing.T) { runCoordinatorSuite(t, c) })
}

// consumerFeatures scale the consumer suite down for JetStream, whose
// round trips make every write and commit far slower than in memory.
// ChurnModel's pull members poll with timeouts of 1 to 20 ms, shorter
// than a Join: a Join cut short must leave no member behind
// (TestJoinCancelledLeavesNoMember).
var consumerFeatures = ferrytest.ConsumerFeatures{Scale: 0.1, Timeout: 30 * time.Second}

// openBackend returns a store and a coordinator of a fresh deployment,
// each over its own connection; Reopen opens the same prefix again;
// Expire deletes a member's key, as its expiry does.
func openBackend(t *testing.T, c *cluster, prefix string) ferrytest.Backend {
	s := openStore(t, c, prefix)
	co := openCoordinator(t, c, prefix)
	return ferrytest.Backend{
		Storage: s, Cursors: s, Coordinator: co,
		Reopen: func(t *testing.T) ferrytest.Backend { return openBackend(t, c, prefix) },
		Expire: func(g ferry.GroupKey, member string) {
			if err := natsstore.DeleteMember(context.Background(), co, g, member); err != nil {
				t.Errorf("expire %s in %s: %v", member, g, err)
			}
		},
	}
}

// dropDeployment deletes, when t ends, the streams and buckets of the
// deployment prefix: each stream of a topic with the default retention
// reserves its MaxBytes of the server's storage, which the suites would
// otherwise exhaust ("insufficient storage resources available").
func dropDeployment(t testing.TB, c *cluster, prefix string) {
	js := c.connect(t)
	t.Cleanup(func() { // before the connection's cleanup: cleanups run last first
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := dropStreams(ctx, js, prefix); err != nil {
			t.Error(err)
		}
	})
}

// dropStreams deletes the streams and buckets of deployment prefix.
func dropStreams(ctx context.Context, js jetstream.JetStream, prefix string) error {
	names := js.StreamNames(ctx)
	var drop []string
	for name := range names.Name() {
		if strings.HasPrefix(name, prefix+"_") || strings.HasPrefix(name, "KV_"+prefix+"_") {
			drop = append(drop, name)
		}
	}
	var errs []error
	if err := names.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list streams: %w", err))
	}
	for _, name := range drop {
		// Not found: deleted meanwhile (by a second drop of the same
		// prefix in the subtest, its listing older than the first's
		// delete), which is what was asked.
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// TestSingleConsumers runs the consumer suite of package ferrytest over
// natsstore (store and coordinator) on the embedded single server.
func TestSingleConsumers(t *testing.T) {
	c := singleServer(t)
	ferrytest.TestConsumers(t, consumerFeatures, func(t *testing.T) ferrytest.Backend {
		prefix := fmt.Sprintf("k%d", fresh.Add(1))
		dropDeployment(t, c, prefix) // after the suite closed the backend
		return openBackend(t, c, prefix)
	})
}

// TestSingleConsumersMemoryCoordinator runs the consumer suite over
// natsstore's store (messages and cursors, reopened between the rounds of
// ChurnModel) with the brokers' own memory coordinators: the store
// checked apart from natsstore's coordinator (TestSingleConsumers runs
// both together).
func TestSingleConsumersMemoryCoordinator(t *testing.T) {
	c := singleServer(t)
	var open func(t *testing.T, prefix string) ferrytest.Backend
	open = func(t *testing.T, prefix string) ferrytest.Backend {
		s := openStore(t, c, prefix)
		return ferrytest.Backend{Storage: s, Cursors: s, Reopen: func(t *testing.T) ferrytest.Backend { return open(t, prefix) }}
	}
	ferrytest.TestConsumers(t, consumerFeatures, func(t *testing.T) ferrytest.Backend {
		prefix := fmt.Sprintf("m%d", fresh.Add(1))
		dropDeployment(t, c, prefix)
		return open(t, prefix)
	})
}
