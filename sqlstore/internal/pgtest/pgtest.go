// Package pgtest starts a throwaway PostgreSQL server for the tests of
// sqlstore: initdb in a temporary directory, postgres on a free port with
// its unix socket in that directory, no TCP listener. As root it runs the
// server as the user "postgres" (postgres refuses to run as root).
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the readiness check's driver
)

// Server is a running PostgreSQL server.
type Server struct {
	dir  string
	cmd  *exec.Cmd
	DSN  string // a keyword/value DSN for database "postgres" as its superuser
	Port int
}

// binDir finds the directory of initdb and postgres: $FERRY_PG_BIN, then
// $PATH, then Debian's /usr/lib/postgresql/*/bin (the newest).
func binDir() (string, error) {
	if d := os.Getenv("FERRY_PG_BIN"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		d := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb found (install postgresql, or set FERRY_PG_BIN)")
}

// Start initialises and starts a server; the caller stops it with Stop.
// The error says why no server could be started.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and no user postgres to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "ferry-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	for _, d := range []string{data, sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fail(err)
		}
		if cred != nil {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				return fail(err)
			}
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w: %s", err, out))
	}
	port, err := freePort()
	if err != nil {
		return fail(err)
	}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return fail(err)
	}
	defer log.Close()
	if cred != nil {
		_ = log.Chown(int(cred.Uid), int(cred.Gid))
	}
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-k", sock, "-c", "listen_addresses=", "-c", "max_connections=100")
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		return fail(fmt.Errorf("postgres: %w", err))
	}
	s.Port = port
	s.DSN = fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", sock, port)
	// Wait until a query goes through (the socket comes before the end
	// of the startup: "the database system is starting up").
	db, err := sql.Open("pgx", s.DSN)
	if err != nil {
		s.Stop()
		return fail(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := db.ExecContext(ctx, "SELECT 1")
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			b, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			return fail(fmt.Errorf("postgres did not start in 30 s: %s", b))
		}
		time.Sleep(20 * time.Millisecond) // a readiness poll, not a test's timing
	}
}

// Stop shuts the server down (fast shutdown), waits for it and removes
// its directory. Idempotent.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		s.cmd = nil
	}
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
