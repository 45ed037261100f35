package remote_test

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/examples/remote"
	"github.com/ferrymq/ferry/filestore"
)

// server is a remote.Server over a filestore in one directory, serving
// on a loopback listener; stop shuts both.
type server struct {
	dir  string
	addr string
	fs   *filestore.Store
	srv  *remote.Server
	done chan error
}

// startServer serves a filestore in dir on addr ("127.0.0.1:0" for any
// port).
func startServer(t testing.TB, dir, addr string, opts ...filestore.Option) *server {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	return serveOn(t, dir, l, opts...)
}

func serveOn(t testing.TB, dir string, l net.Listener, opts ...filestore.Option) *server {
	t.Helper()
	opts = append([]filestore.Option{filestore.WithSync(filestore.SyncNever), filestore.WithSegmentBytes(64 << 10)}, opts...)
	fs, err := filestore.Open(dir, opts...)
	require.NoError(t, err)
	srv, err := remote.NewServer(fs)
	require.NoError(t, err)
	s := &server{dir: dir, addr: l.Addr().String(), fs: fs, srv: srv, done: make(chan error, 1)}
	go func() { s.done <- srv.Serve(l) }()
	t.Cleanup(s.stop)
	return s
}

// stop closes the server and its store; it is idempotent.
func (s *server) stop() {
	if s.srv == nil {
		return
	}
	_ = s.srv.Close()
	<-s.done
	_ = s.fs.Close()
	s.srv = nil
}

func dial(t testing.TB, addr string, opts ...remote.Option) *remote.Storage {
	t.Helper()
	st, err := remote.NewStorage(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// memDir returns a fresh directory in memory (on /dev/shm, where there is
// one), removed when the test ends, else t.TempDir(). The queue suite's
// servers keep their filestore there: the suite checks the wire, and
// filestore's directory fsyncs when it rolls segments (dozens in
// ConcurrentRetention) made it disk-bound on a shared disk, 5 to 12 s of
// the module's test time. filestore's own suite checks it on disk.
func memDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "ferry-remote-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
