package filestore

import (
	"context"
	"fmt"

	"github.com/ferrymq/ferry"
)

// checkContext returns an error wrapping [ferry.ErrInvalidOption] for a
// nil ctx: every method here that takes a context refuses a nil one so,
// at its top, as the seams' contracts ask.
func checkContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)
	}
	return nil
}
