package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
)

// TestJoinCancelledLeavesNoMember: a Join that fails with its ctx's error
// leaves no member behind. (It did: a create whose reply came after the
// ctx ended left the member key, a ghost holding the member ID and a
// share of the queues for a TTL; a PullConsumer polling with a short
// timeout could keep a ghost of itself in its group.)
func TestJoinCancelledLeavesNoMember(t *testing.T) {
	c := singleServer(t)
	co := openCoordinator(t, c, fmt.Sprintf("jc%d", fresh.Add(1)))
	defer co.Close()
	g := ferry.GroupKey{Scope: "g", Topic: "t"}
	failed := 0
	for i := range 50 {
		m := fmt.Sprintf("m%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Microsecond)
		s, err := co.Join(ctx, g, m)
		cancel()
		if err == nil {
			_ = s.Leave(context.Background())
			continue
		}
		failed++
		ms, err2 := co.Members(context.Background(), g)
		if err2 != nil {
			t.Fatal(err2)
		}
		for _, x := range ms {
			if x == m {
				t.Errorf("Join(%s) failed with %v, yet %s is a member: %v", m, err, m, ms)
			}
		}
	}
	t.Logf("%d of 50 joins failed", failed)
}
