package natsstore_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(natsMovesEnv) != "" {
		os.Exit(natsMovesChild())
	}
	if os.Getenv(serverEnv) != "" {
		os.Exit(serverMain())
	}
	code := m.Run()
	stopServers()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// prefixFor names the deployment a suite's dir stands for.
func prefixFor(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "t" + hex.EncodeToString(sum[:6])
}
