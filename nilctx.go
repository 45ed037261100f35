package ferry

import (
	"context"
	"fmt"
)

// checkContext returns an error wrapping [ErrInvalidOption] for a nil
// ctx: every exported call that takes a context refuses a nil one this
// way, at its top, instead of panicking on first use.
func checkContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	}
	return nil
}
