package filestore_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		os.Exit(0)
	}
	if os.Getenv(dedupChildEnv) != "" {
		dedupChild()
		os.Exit(0)
	}
	if os.Getenv(lockChildEnv) != "" {
		lockChild()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
