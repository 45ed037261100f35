package natsstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// A lease's deadline is its lost timer's: the start of its last
// successful renewal plus safety × TTL, ahead of now and moving on with
// the renewals (every TTL/3), so a member paused past it starts nothing
// more before the timer runs (see ferry.DeadlineLease).
func TestLeaseDeadline(t *testing.T) {
	const ttl = 2 * time.Second
	ctx := context.Background()
	co := openCoordinator(t, singleServer(t), "deadline", natsstore.WithTTL(ttl))
	defer co.Close()
	s, err := co.Join(ctx, ferry.GroupKey{Scope: "g", Topic: "t"}, "m")
	require.NoError(t, err)
	before := time.Now()
	l, err := s.Lock(ctx, 0)
	require.NoError(t, err)
	dl, ok := l.(ferry.DeadlineLease)
	require.True(t, ok, "natsstore's lease is a DeadlineLease")
	first, ok := dl.Deadline()
	require.True(t, ok)
	assert.True(t, first.After(before) && !first.After(time.Now().Add(ttl)), "deadline %v within the TTL from the lock", first)
	require.Eventually(t, func() bool {
		d, _ := dl.Deadline()
		return d.After(first)
	}, 10*ttl, 10*time.Millisecond, "a renewal moves the deadline on")
	require.NoError(t, l.Release(ctx))
	require.NoError(t, s.Leave(ctx))
}
