package ferrytest_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

func TestFakeCoordinatorFaults(t *testing.T) {
	ctx := t.Context()
	c := ferrytest.NewFakeCoordinator()
	defer c.Close()
	g := ferry.GroupKey{Scope: "billing", Topic: "orders"}
	a, err := c.Join(ctx, g, "m-a")
	require.NoError(t, err)
	b, err := c.Join(ctx, g, "m-b")
	require.NoError(t, err)
	la0, err := a.Lock(ctx, 0)
	require.NoError(t, err)
	la1, err := a.Lock(ctx, 1)
	require.NoError(t, err)

	m, tok, ok := c.Holder(g, 0)
	assert.True(t, ok)
	assert.Equal(t, "m-a", m)
	assert.Equal(t, la0.Token(), tok)
	_, _, ok = c.Holder(g, 2)
	assert.False(t, ok, "nobody holds queue 2")
	assert.Equal(t, []ferrytest.FakeSessionInfo{
		{Group: g, Member: "m-a", Queues: []int{0, 1}},
		{Group: g, Member: "m-b", Queues: []int{}},
	}, c.Sessions())

	// LoseLease: the lease is lost, the session lives on.
	require.True(t, c.LoseLease(g, 1))
	require.False(t, c.LoseLease(g, 1), "lost already")
	select {
	case <-la1.Lost():
	default:
		t.Fatal("Lost not closed by LoseLease")
	}
	lb1, err := b.Lock(ctx, 1)
	require.NoError(t, err)
	assert.Greater(t, lb1.Token(), la1.Token())
	require.NoError(t, la1.Release(ctx), "Release of a lost lease")
	select {
	case <-a.Done():
		t.Fatal("LoseLease ended the session")
	default:
	}

	// Expire with FailJoins: the member stays out until let in.
	errDown := errors.New("network down")
	c.FailJoins(g, "m-a", errDown)
	require.True(t, c.Expire(g, "m-a"))
	require.False(t, c.Expire(g, "m-a"), "expired already")
	<-la0.Lost()
	<-a.Done()
	_, err = c.Join(ctx, g, "m-a")
	require.ErrorIs(t, err, errDown)
	_, err = c.Join(ctx, ferry.GroupKey{Scope: "shipping", Topic: "orders"}, "m-a")
	require.NoError(t, err, "FailJoins is per group")
	c.FailJoins(g, "m-a", nil)
	_, err = c.Join(ctx, g, "m-a")
	require.NoError(t, err)
	m, _, _ = c.Holder(g, 1)
	assert.Equal(t, "m-b", m)

	require.NoError(t, c.Close())
	assert.Empty(t, c.Sessions())
	select {
	case <-lb1.Lost():
	default:
		t.Fatal("Lost not closed by Close")
	}
}
