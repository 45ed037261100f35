package natsstore_test

import (
	"errors"
	"strings"

	"net"
	"os"
	"testing"

	"github.com/ferrymq/ferry"
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

func errorsIsFenced(err error) bool { return errors.Is(err, ferry.ErrFenced) }

// holderOf returns the member a member or lock key's value names: the
// value is the member and its session's random tag.
func holderOf(v []byte) string {
	if i := strings.IndexByte(string(v), ' '); i >= 0 {
		return string(v[:i])
	}
	return string(v)
}
