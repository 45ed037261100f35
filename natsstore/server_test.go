package natsstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// cluster is a set of embedded servers (one, or three forming a cluster).
type cluster struct {
	servers []*server.Server
}

var (
	serversMu sync.Mutex
	single    *cluster
	triple    *cluster
)

func stopServers() {
	serversMu.Lock()
	defer serversMu.Unlock()
	for _, c := range []*cluster{single, triple} {
		if c == nil {
			continue
		}
		for _, s := range c.servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
}

// singleServer returns the process's one embedded JetStream server.
func singleServer(t testing.TB) *cluster {
	serversMu.Lock()
	defer serversMu.Unlock()
	if single == nil {
		dir, err := mkdirTemp()
		if err != nil {
			t.Fatal(err)
		}
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, JetStreamMaxStore: testMaxStore, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats server not ready")
		}
		single = &cluster{servers: []*server.Server{s}}
	}
	return single
}

// tripleServer returns the process's embedded 3-node cluster, waiting
// until its JetStream meta leader answers.
func tripleServer(t testing.TB) *cluster {
	serversMu.Lock()
	defer serversMu.Unlock()
	if triple == nil {
		triple = newTriple(t)
	}
	return triple
}

// newTriple starts a 3-node cluster and waits for its meta leader; the
// caller shuts it down.
func newTriple(t testing.TB) *cluster {
	ports := make([]int, 3)
	for i := range ports {
		ports[i] = freePort(t)
	}
	routes := ""
	for i, p := range ports {
		if i > 0 {
			routes += ","
		}
		routes += fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	c := &cluster{}
	for i := range 3 {
		dir, err := mkdirTemp()
		if err != nil {
			t.Fatal(err)
		}
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, JetStreamMaxStore: testMaxStore, NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "ferry", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(routes),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		c.servers = append(c.servers, s)
	}
	for _, s := range c.servers {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats server not ready")
		}
	}
	// Requests before the meta leader is elected get no reply.
	nc, err := nats.Connect(c.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream meta leader not elected: %v", err)
		}
	}
	// The meta leader answers before it knows every peer: R3 placement
	// fails ("no suitable peers") until it does.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "probe", Replicas: 3, Storage: jetstream.MemoryStorage})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("three JetStream peers not seen: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, "probe"); err != nil {
		t.Fatalf("delete probe stream: %v", err)
	}
	return c
}

func (c *cluster) shutdown() {
	for _, s := range c.servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

func (c *cluster) url() string {
	u := ""
	for i, s := range c.servers {
		if i > 0 {
			u += ","
		}
		u += s.ClientURL()
	}
	return u
}

// connect returns a JetStream over a new connection, closed when t ends.
func (c *cluster) connect(t testing.TB) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(c.url(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// testMaxStore is the embedded servers' JetStream storage limit. Every
// stream of a topic with the default retention reserves its MaxBytes
// (256 MiB) against it; by default it is a share of the free disk, which
// differs from machine to machine, so the suites could fail on a smaller
// disk ("insufficient storage resources available") though they write
// little. A reservation is accounting, not space used.
const testMaxStore = 1 << 40
