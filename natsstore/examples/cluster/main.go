// Command cluster shows a Ferry consumer group spread over processes and
// an embedded 3-node NATS cluster, with every message kept on three
// replicas.
//
// It starts three nats-server nodes on loopback (random ports, temporary
// directories, removed at the end), creates topic "orders" (6 queues,
// R3), then re-executes itself as child processes: three members of
// consumer group "billing" and two producers. Each member reports what it
// handles over NATS; the parent prints which queues each member owns and
// checks that every message sent was handled. It exits 0 when none was
// lost, in a few seconds:
//
//	cd natsstore && go run ./examples/cluster
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// A child process learns its role from these variables.
const (
	roleEnv = "FERRY_CLUSTER_ROLE" // "member" or "producer"
	nameEnv = "FERRY_CLUSTER_NAME" // member ID or producer name
	urlEnv  = "FERRY_CLUSTER_URL"  // the cluster's client URLs
	sendEnv = "FERRY_CLUSTER_SEND" // messages a producer sends
)

// opts are every Store's and Coordinator's: three replicas, and a longer
// bound on a request than the default 2 s, since creating a stream (a
// queue, the group's dead-letter topic) on R3 waits for a Raft election,
// which takes longer while several processes create streams at once on a
// busy machine.
var opts = []natsstore.Option{natsstore.WithPrefix(prefix), natsstore.WithReplicas(3), natsstore.WithOpTimeout(10 * time.Second)}

const (
	prefix    = "demo"
	topic     = "orders"
	group     = "billing"
	queues    = 6
	members   = 3
	producers = 2
	perProd   = 500
)

func main() {
	var err error
	if isChild() {
		err = child(context.Background())
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		err = run(ctx, os.Stdout, os.Args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

// isChild reports whether this process was started by run as a member or
// a producer (then call child).
func isChild() bool { return os.Getenv(roleEnv) != "" }

// run starts the cluster and the children (self re-executed as exe),
// prints what each member owned and handled to w, and returns an error if
// a message was lost.
func run(ctx context.Context, w io.Writer, exe string) (err error) {
	start := time.Now()
	cl, err := startCluster(ctx)
	if err != nil {
		return err
	}
	defer cl.shutdown()
	fmt.Fprintf(w, "nats cluster of 3 nodes up: %s\n", cl.url())

	nc, err := nats.Connect(cl.url())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// The parent only creates the topic and listens; its Store makes the
	// buckets with three replicas, and the children find them.
	st, err := natsstore.Open(ctx, js, opts...)
	if err != nil {
		return err
	}
	defer st.Close()
	co, err := natsstore.NewCoordinator(ctx, js, opts...)
	if err != nil {
		return err
	}
	co.Close()
	// Make the topic and the group's dead-letter topic (its default name)
	// with their streams here, once: three members creating the same new
	// R3 stream at the same moment may wait out their timeout.
	for _, meta := range []ferry.TopicMeta{{Name: topic, Queues: queues}, {Name: "%DLQ%" + group, Queues: 1}} {
		if err := st.CreateTopic(ctx, meta); err != nil {
			return err
		}
		for i := range meta.Queues {
			q, err := st.OpenQueue(ctx, meta, i)
			if err != nil {
				return err
			}
			if err := q.Close(); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(w, "topic %q: %d queues, each a stream with 3 replicas (%v)\n", topic, queues, time.Since(start).Round(time.Millisecond))

	// Handled messages: body -> times handled, and per member a count.
	var mu sync.Mutex
	seen := map[string]int{}
	byMember := map[string]int{}
	progress := make(chan struct{}, 1)
	sub, err := nc.Subscribe(prefix+".handled", func(m *nats.Msg) {
		member, body, _ := strings.Cut(string(m.Data), " ")
		mu.Lock()
		seen[body]++
		byMember[member]++
		mu.Unlock()
		select {
		case progress <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return err
	}

	var kids []*proc
	defer func() {
		for _, k := range kids {
			err = errors.Join(err, k.stop())
		}
	}()
	for i := range members {
		k, err := spawn(exe, cl.url(), "member", fmt.Sprintf("m%d", i+1), 0)
		if err != nil {
			return err
		}
		kids = append(kids, k)
	}
	owned, err := waitSplit(ctx, nc)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "group %q of %d member processes split the %d queues of %q: %s\n", group, members, queues, topic, fmtOwned(owned))

	var prods []*proc
	for i := range producers {
		p, err := spawn(exe, cl.url(), "producer", fmt.Sprintf("p%d", i+1), perProd)
		if err != nil {
			return err
		}
		prods = append(prods, p)
	}
	for _, p := range prods {
		if err := p.wait(ctx); err != nil {
			return fmt.Errorf("producer %s: %w", p.name, err)
		}
	}
	total := producers * perProd
	fmt.Fprintf(w, "%d producer processes sent %d messages (acknowledged by the stream leaders, on 3 replicas)\n", producers, total)

	for {
		mu.Lock()
		distinct := len(seen)
		mu.Unlock()
		if distinct == total {
			break
		}
		select {
		case <-progress:
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%d of %d messages handled: %w", distinct, total, ctx.Err())
		}
	}
	owned, err = ownership(ctx, nc)
	if err != nil {
		return err
	}
	mu.Lock()
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	for _, m := range slices.Sorted(maps.Keys(byMember)) {
		fmt.Fprintf(w, "  member %s owns queues %v, handled %d messages\n", m, owned[m], byMember[m])
	}
	mu.Unlock()
	fmt.Fprintf(w, "sent %d, handled %d distinct (%d more than once): nothing lost, in %v\n",
		total, total, dups, time.Since(start).Round(time.Millisecond))
	return nil
}

// cluster is three embedded nats-server nodes.
type cluster struct {
	servers []*server.Server
	dirs    []string
}

// startCluster starts three nodes on loopback, routing to each other,
// and waits for them and for the JetStream meta leader.
func startCluster(ctx context.Context) (_ *cluster, err error) {
	c := &cluster{}
	defer func() {
		if err != nil {
			c.shutdown()
		}
	}()
	// Cluster ports: free ones the kernel picks (each node must know the
	// others' before it starts).
	var ports [3]int
	var routes []string
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i]))
	}
	for i := range ports {
		dir, err := os.MkdirTemp("", "ferry-cluster-example-*")
		if err != nil {
			return nil, err
		}
		c.dirs = append(c.dirs, dir)
		s, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "ferry-example", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if err != nil {
			return nil, err
		}
		s.Start()
		c.servers = append(c.servers, s)
	}
	for i, s := range c.servers {
		if !s.ReadyForConnections(10 * time.Second) {
			return nil, fmt.Errorf("nats node n%d not ready", i+1)
		}
	}
	// Requests before the meta leader is elected get no reply.
	nc, err := nats.Connect(c.url())
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("JetStream meta leader not elected: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) url() string {
	urls := make([]string, len(c.servers))
	for i, s := range c.servers {
		urls[i] = s.ClientURL()
	}
	return strings.Join(urls, ",")
}

func (c *cluster) shutdown() {
	for _, s := range c.servers {
		s.Shutdown()
	}
	for _, s := range c.servers {
		s.WaitForShutdown()
	}
	for _, d := range c.dirs {
		_ = os.RemoveAll(d)
	}
}

// proc is a child process. Closing its stdin tells it to stop (and it
// stops too if the parent dies).
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{}
	err   error // of Wait, once done
}

func spawn(exe, url, role, name string, send int) (*proc, error) {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"="+role, nameEnv+"="+name, urlEnv+"="+url, sendEnv+"="+strconv.Itoa(send))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop closes the child's stdin and waits for it to exit (killing it
// after 10 s).
func (p *proc) stop() error {
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop: killed", p.name)
	}
	if p.err != nil {
		return fmt.Errorf("%s: %w", p.name, p.err)
	}
	return nil
}

// ownership asks every member which queues it owns ("<prefix>.owns",
// answered by each), for up to a second.
func ownership(ctx context.Context, nc *nats.Conn) (map[string][]int, error) {
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(prefix+".owns", inbox, nil); err != nil {
		return nil, err
	}
	out := map[string][]int{}
	deadline := time.Now().Add(time.Second)
	for len(out) < members && time.Now().Before(deadline) {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, err
		}
		member, qs, _ := strings.Cut(string(m.Data), " ")
		out[member] = []int{}
		for f := range strings.FieldsSeq(qs) {
			q, _ := strconv.Atoi(f)
			out[member] = append(out[member], q)
		}
		slices.Sort(out[member])
	}
	if len(out) < members {
		return out, fmt.Errorf("%d of %d members answered", len(out), members)
	}
	return out, nil
}

// waitSplit waits until every member answers and each owns queues/members
// queues.
func waitSplit(ctx context.Context, nc *nats.Conn) (map[string][]int, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		owned, err := ownership(actx, nc)
		cancel()
		if err == nil && !slices.ContainsFunc(slices.Collect(maps.Values(owned)), func(qs []int) bool { return len(qs) != queues/members }) {
			return owned, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("members never split the queues (last: %v): %w", owned, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func fmtOwned(owned map[string][]int) string {
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(owned)) {
		parts = append(parts, fmt.Sprintf("%s %v", m, owned[m]))
	}
	return strings.Join(parts, ", ")
}

// child is a member or a producer, started by run.
func child(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Stop when the parent closes stdin or dies.
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		cancel()
	}()
	role, name := os.Getenv(roleEnv), os.Getenv(nameEnv)
	nc, err := nats.Connect(os.Getenv(urlEnv), nats.Name(name))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	st, err := natsstore.Open(ctx, js, opts...)
	if err != nil {
		return err
	}
	defer st.Close()
	co, err := natsstore.NewCoordinator(ctx, js, opts...)
	if err != nil {
		return err
	}
	defer co.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st), ferry.WithCoordinator(co))
	if err != nil {
		return err
	}
	defer b.Close()

	switch role {
	case "producer":
		n, _ := strconv.Atoi(os.Getenv(sendEnv))
		p, err := b.NewProducer(ferry.WithProducerName(name))
		if err != nil {
			return err
		}
		defer p.Close()
		// Batches of 50, keyed so that they spread over the queues.
		batch := make([]*ferry.Message, 0, 50)
		for i := range n {
			body := fmt.Sprintf("%s-%d", name, i)
			batch = append(batch, &ferry.Message{Topic: topic, Key: body, Body: []byte(body)})
			if len(batch) == cap(batch) || i == n-1 {
				if _, err := p.SendBatch(ctx, batch); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		return nil
	case "member":
		var c *ferry.Consumer
		c, err = b.NewConsumer(group, topic, ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
			return nc.Publish(prefix+".handled", []byte(name+" "+string(m.Body)))
		}), ferry.WithMemberID(name))
		if err != nil {
			return err
		}
		sub, err := nc.Subscribe(prefix+".owns", func(m *nats.Msg) {
			var qs []string
			for _, q := range c.Assigned() {
				qs = append(qs, strconv.Itoa(q.Queue))
			}
			_ = m.Respond([]byte(name + " " + strings.Join(qs, " ")))
		})
		if err != nil {
			return err
		}
		defer sub.Unsubscribe()
		if err := c.Start(ctx); err != nil {
			return err
		}
		<-ctx.Done()
		return c.Close()
	}
	return fmt.Errorf("unknown role %q", role)
}
