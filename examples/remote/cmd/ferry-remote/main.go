// Command ferry-remote serves the topics of a filestore directory to
// remote.Storage clients over HTTP/2 (without TLS: run it on a trusted
// network), until SIGINT or SIGTERM:
//
//	ferry-remote -dir /var/lib/ferry -addr 127.0.0.1:7420
//
// A broker in another process then runs on its queues:
//
//	st, _ := remote.NewStorage("127.0.0.1:7420")
//	b, _ := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferrymq/ferry/examples/remote"
	"github.com/ferrymq/ferry/filestore"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ferry-remote:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("ferry-remote", flag.ContinueOnError)
	dir := fl.String("dir", "", "the filestore directory (required)")
	addr := fl.String("addr", "127.0.0.1:7420", "the address to listen on")
	sync := fl.Bool("sync", true, "fdatasync each write before acknowledging it (false: a crash of the process still loses nothing, a power loss may)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("-dir is required")
	}
	policy := filestore.SyncAlways
	if !*sync {
		policy = filestore.SyncNever
	}
	fs, err := filestore.Open(*dir, filestore.WithSync(policy))
	if err != nil {
		return err
	}
	defer fs.Close()
	srv, err := remote.NewServer(fs)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Fprintf(os.Stderr, "ferry-remote: serving %s on %s\n", *dir, l.Addr())
	select {
	case err = <-served:
		_ = srv.Close()
		return err
	case <-ctx.Done():
	}
	err = srv.Close()
	return errors.Join(err, <-served)
}
