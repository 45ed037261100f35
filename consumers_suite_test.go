package ferry_test

import (
	"testing"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
)

// TestConsumers runs the consumer suite of package ferrytest on the
// memory backend (filestore and natsstore run it in their own tests).
func TestConsumers(t *testing.T) {
	ferrytest.TestConsumers(t, ferrytest.ConsumerFeatures{}, func(t *testing.T) ferrytest.Backend {
		return ferrytest.Backend{Storage: ferry.NewMemoryStorage(), Cursors: ferry.NewMemoryCursorStore(), Coordinator: ferry.NewMemoryCoordinator()}
	})
}
