package ferrywm

import (
	"context"
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/require"
)

// Close returns only once the goroutine of every subscription has ended,
// so no subscription is left behind.
func TestCloseWaitsForSubscriptionGoroutines(t *testing.T) {
	b, err := ferry.NewBroker()
	require.NoError(t, err)
	defer b.Close()
	s, err := NewSubscriber(b, SubscriberConfig{})
	require.NoError(t, err)
	for range 8 {
		_, err := s.Subscribe(context.Background(), "t")
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Empty(t, s.subs)
}
