package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunBadInput: bad flags, a missing -dir and a bad address are
// errors, and nothing keeps running.
func TestRunBadInput(t *testing.T) {
	require.ErrorContains(t, run(nil), "-dir is required")
	require.Error(t, run([]string{"-nope"}))
	require.ErrorContains(t, run([]string{"-dir", t.TempDir(), "-addr", "127.0.0.1:x"}), "listen tcp")
}
