package natsstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestAskCreateBounds: askCreate asks a create refused with 10049 again,
// at most createTries times and within its caller's context, and returns
// any other answer at the first.
func TestAskCreateBounds(t *testing.T) {
	cfg := config{opTimeout: time.Minute}
	refused := &jetstream.APIError{Code: 500, ErrorCode: 10049, Description: "error creating store for stream"}
	other := &jetstream.APIError{Code: 500, ErrorCode: 10077, Description: "other"}
	ctx := t.Context()

	calls := 0
	_, err := askCreate(ctx, cfg, func(context.Context) (int, error) { calls++; return 0, refused })
	require.ErrorIs(t, err, refused)
	require.Equal(t, createTries, calls, "tries of a create refused every time")

	calls = 0
	v, err := askCreate(ctx, cfg, func(context.Context) (int, error) {
		calls++
		if calls < 3 {
			return 0, refused
		}
		return 7, nil
	})
	require.NoError(t, err)
	require.Equal(t, 7, v)
	require.Equal(t, 3, calls)

	for _, want := range []error{other, jetstream.ErrStreamNameAlreadyInUse, errors.New("boom")} {
		calls = 0
		_, err = askCreate(ctx, cfg, func(context.Context) (int, error) { calls++; return 0, want })
		require.Same(t, want, err)
		require.Equal(t, 1, calls, "tries of a create answered %v", want)
	}

	// No peers for placement (a cluster just started): asked again
	// beyond createTries, until the op timeout.
	noPeers := &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}
	calls = 0
	v, err = askCreate(ctx, config{opTimeout: 10 * time.Second}, func(context.Context) (int, error) {
		calls++
		if calls < createTries+3 {
			return 0, noPeers
		}
		return 9, nil
	})
	require.NoError(t, err)
	require.Equal(t, 9, v)
	calls = 0
	_, err = askCreate(ctx, config{opTimeout: 300 * time.Millisecond}, func(context.Context) (int, error) { calls++; return 0, noPeers })
	require.ErrorIs(t, err, noPeers, "refused until the op timeout: its answer")

	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	_, err = askCreate(cctx, cfg, func(context.Context) (int, error) { calls++; cancel(); return 0, refused })
	require.ErrorIs(t, err, refused)
	require.Equal(t, 1, calls, "tries after the caller's context ended")
}

// TestNoStreamResponseAskedAgain: a request that got "no response from
// stream" (jetstream's word for no responders, while a stream elects
// its leader after a node died) was answered by no server: it is asked
// again, as the other unanswered ones are. A member's leave after a node
// kill failed on it at once (TestTransactionalNodeKill, once in CI).
func TestNoStreamResponseAskedAgain(t *testing.T) {
	require.True(t, unanswered(jetstream.ErrNoStreamResponse))
	require.True(t, unanswered(fmt.Errorf("delete key: %w", jetstream.ErrNoStreamResponse)))
	calls := 0
	v, err := ask(t.Context(), config{opTimeout: time.Minute}, func(context.Context) (int, error) {
		calls++
		if calls < 3 {
			return 0, jetstream.ErrNoStreamResponse
		}
		return 7, nil
	})
	require.NoError(t, err)
	require.Equal(t, 7, v)
	require.Equal(t, 3, calls)
}
