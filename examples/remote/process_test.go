package remote_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/examples/remote"
	"github.com/ferrymq/ferry/filestore"
)

// serverEnv names the store directory of a server process: the test
// binary, started with it set, serves a filestore there (see serverMain)
// on the listener it inherits as file descriptor 3.
const serverEnv = "FERRY_REMOTE_SERVER"

// serverMain is the server process: what cmd/ferry-remote does, on an
// inherited listener, so that every server the test starts answers at the
// same address without a race for the port. It runs until killed.
func serverMain(dir string) int {
	l, err := net.FileListener(os.NewFile(3, "listener"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 2
	}
	// SyncNever: a write is acknowledged once in the page cache, which a
	// killed process does not lose.
	fs, err := filestore.Open(dir, filestore.WithSync(filestore.SyncNever))
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 2
	}
	srv, err := remote.NewServer(fs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 2
	}
	if err := srv.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 2
	}
	return 0
}

// serverProcess runs server processes, one at a time, on one listener.
type serverProcess struct {
	t   *testing.T
	dir string
	lf  *os.File
	cmd *exec.Cmd
}

func (p *serverProcess) start() {
	p.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serverEnv+"="+p.dir)
	cmd.ExtraFiles = []*os.File{p.lf}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childAttr() // on Linux, the server dies with the test
	require.NoError(p.t, cmd.Start())
	p.cmd = cmd
}

// kill SIGKILLs the server and waits for it to be gone.
func (p *serverProcess) kill() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGKILL))
	err := p.cmd.Wait()
	require.Error(p.t, err, "the server exited before it was killed")
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(p.t, ws.Signaled(), "server: %v", err)
}

// TestProcessKill runs a broker, a producer and a consumer group in this
// process against queues (and cursors) served by another, which it SIGKILLs three times
// while the producer sends (and starts again, on the same address and
// store). Every message whose send was acknowledged is delivered and is
// in the store; nothing is delivered that was not sent; every message in
// the store reads back whole.
func TestProcessKill(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lf, err := l.(*net.TCPListener).File()
	require.NoError(t, err)
	addr := l.Addr().String()
	// The listener stays open here while no server runs: a client's
	// connection waits in its backlog for the next server.
	defer l.Close()
	defer lf.Close()
	srv := &serverProcess{t: t, dir: t.TempDir(), lf: lf}
	srv.start()
	defer func() {
		if srv.cmd.ProcessState == nil {
			srv.kill()
		}
	}()

	st, err := remote.NewStorage(addr)
	require.NoError(t, err)
	defer st.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
	require.NoError(t, err)
	defer b.Close()
	const topic = "orders"
	require.NoError(t, b.CreateTopic(t.Context(), ferry.TopicMeta{Name: topic, Queues: 4}))

	var mu sync.Mutex // guards acked, delivered, want and onAll
	acked := map[string]bool{}
	delivered := map[string]bool{}
	want := -1 // acked messages the consumer must get; -1 while sending
	allIn := make(chan struct{})
	checkAll := func() { // with mu held
		if want >= 0 && allIn != nil {
			for k := range acked {
				if !delivered[k] {
					return
				}
			}
			close(allIn)
			allIn = nil
		}
	}
	c, err := b.NewConsumer("billing", topic, ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		delivered[string(m.Body)] = true
		checkAll()
		return nil
	}))
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	defer c.Close()

	p, err := b.NewProducer()
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a hang fails; it bounds no timing
	defer cancel()

	// The producer sends until the server has been killed three times
	// and 300 more sends are acknowledged after the last restart; the
	// killer kills at 300, 900 and 1500 acknowledgements.
	ackCount := 0
	killAt := []int{300, 900, 1500}
	killsDue, killed := 0, 0 // kills the acknowledgements asked for; kills made
	stopAt := -1
	var sendErrs int
	sent := 0
	for ; ; sent++ {
		mu.Lock()
		done := stopAt >= 0 && ackCount >= stopAt
		kill := killsDue > killed
		mu.Unlock()
		if done {
			break
		}
		if kill {
			srv.kill()
			srv.start()
			killed++
			mu.Lock()
			if killed == 3 {
				stopAt = ackCount + 300
			}
			mu.Unlock()
		}
		body := "m-" + strconv.Itoa(sent)
		err := p.SendAsync(ctx, &ferry.Message{Topic: topic, Key: body, Body: []byte(body)}, func(res ferry.SendResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				sendErrs++
				return
			}
			acked[body] = true
			ackCount++
			if len(killAt) > 0 && ackCount >= killAt[0] {
				killAt = killAt[1:]
				killsDue++
			}
		})
		require.NoError(t, err)
	}
	require.NoError(t, p.Flush(ctx))
	mu.Lock()
	want = len(acked)
	checkAll()
	wait := allIn
	mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			mu.Lock()
			var missing []string
			for k := range acked {
				if !delivered[k] {
					missing = append(missing, k)
				}
			}
			mu.Unlock()
			t.Fatalf("%d acknowledged messages never delivered, such as %v", len(missing), missing[:min(5, len(missing))])
		}
	}
	require.NoError(t, c.Close())

	// Nothing delivered that was not sent.
	mu.Lock()
	defer mu.Unlock()
	for k := range delivered {
		n, err := strconv.Atoi(strings.TrimPrefix(k, "m-"))
		require.NoError(t, err, "delivered %q", k)
		require.Less(t, n, sent, "delivered %q, never sent", k)
	}
	// Every acknowledged message is in the store, and the store reads
	// back whole.
	stored := map[string]bool{}
	for i := range 4 {
		q, err := st.OpenQueue(ctx, ferry.TopicMeta{Name: topic, Queues: 4}, i)
		require.NoError(t, err)
		oldest, next, err := q.(ferry.OffsetsContexter).OffsetsContext(ctx)
		require.NoError(t, err)
		require.Zero(t, oldest)
		for _, m := range readAll(t, q, 0, next) {
			require.Equal(t, topic, m.Topic)
			require.Equal(t, m.Key, string(m.Body))
			stored[string(m.Body)] = true
		}
		require.NoError(t, q.Close())
	}
	for k := range acked {
		require.True(t, stored[k], "acknowledged %q is not in the store", k)
	}
	t.Logf("sent %d, acknowledged %d, failed %d, stored %d, delivered %d", sent, len(acked), sendErrs, len(stored), len(delivered))
}
