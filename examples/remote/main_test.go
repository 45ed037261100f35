package remote_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(serverEnv); dir != "" {
		os.Exit(serverMain(dir)) // the server process of TestProcessKill
	}
	goleak.VerifyTestMain(m)
}
