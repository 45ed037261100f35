package natsstore_test

import (
	"net"
	"os"
	"testing"
)

func mkdirTemp() (string, error) { return os.MkdirTemp("", "natsstore-") }

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
