package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/natsstore"
)

// TestLeaveAfterUnseenRenewal: Leave deletes the member key, and Release
// the lock key, even when the key was renewed past the revision the
// session knows (a heartbeat in flight when the session stopped, or one
// whose reply was lost): Members no longer lists the member once Leave
// returns, and the lock is free at once. (Neither was: the delete,
// checked against the known revision, was refused, and the key lived
// until its TTL.)
func TestLeaveAfterUnseenRenewal(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    func(testing.TB) *cluster
	}{{"Single", singleServer}, {"Cluster", tripleServer}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "Cluster" && testing.Short() {
				t.Skip("-short: no cluster")
			}
			c := tc.c(t)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			prefix := fmt.Sprintf("lu%d", fresh.Add(1))
			dropDeployment(t, c, prefix)
			co := openCoordinator(t, c, prefix, natsstore.WithTTL(time.Minute))
			defer co.Close()
			g := ferry.GroupKey{Scope: "g", Topic: "t"}
			a, err := co.Join(ctx, g, "m-a")
			require.NoError(t, err)
			b, err := co.Join(ctx, g, "m-b")
			require.NoError(t, err)

			l, err := a.Lock(ctx, 0)
			require.NoError(t, err)
			require.NoError(t, natsstore.RenewUnseen(ctx, a, 0))
			require.NoError(t, l.Release(ctx))
			lctx, lcancel := context.WithTimeout(ctx, 5*time.Second) // far below the TTL
			lb, err := b.Lock(lctx, 0)
			lcancel()
			require.NoError(t, err, "Lock of a queue whose lease was released after an unseen renewal")
			require.Greater(t, lb.Token(), l.Token())

			require.NoError(t, natsstore.RenewUnseen(ctx, a, -1))
			require.NoError(t, a.Leave(ctx))
			ms, err := co.Members(ctx, g)
			require.NoError(t, err)
			require.Equal(t, []string{"m-b"}, ms, "Members right after m-a's Leave")
		})
	}
}
