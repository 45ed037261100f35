package natsstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/natsstore"
)

// TestRenewApplied: a renewal refused for its revision takes the key's
// later revision when the key still holds the member (an earlier try was
// applied, its reply lost with a dying server), and is refused when the
// key holds another member or is gone.
func TestRenewApplied(t *testing.T) {
	c := singleServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	js := c.connect(t)
	co, err := natsstore.NewCoordinator(ctx, js, natsstore.WithPrefix("renew"), natsstore.WithTTL(childTTL))
	require.NoError(t, err)
	defer co.Close()
	kv, err := js.KeyValue(ctx, "renew_locks")
	require.NoError(t, err)
	r1, err := kv.Create(ctx, "g.0", []byte("a"))
	require.NoError(t, err)
	r2, err := kv.Update(ctx, "g.0", []byte("a"), r1) // the try whose reply was lost
	require.NoError(t, err)

	nrev, applied, refused := natsstore.RenewApplied(co, "g.0", "a", r1)
	require.True(t, applied)
	require.False(t, refused)
	require.Equal(t, r2, nrev)

	_, applied, refused = natsstore.RenewApplied(co, "g.0", "b", r1)
	require.False(t, applied, "another member's key")
	require.True(t, refused)

	_, applied, refused = natsstore.RenewApplied(co, "g.0", "a", r2)
	require.False(t, applied, "no later revision")
	require.True(t, refused)

	require.NoError(t, kv.Delete(ctx, "g.0"))
	_, applied, refused = natsstore.RenewApplied(co, "g.0", "a", r1)
	require.False(t, applied, "a deleted key")
	require.True(t, refused)
}
