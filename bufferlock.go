package ferry

import "context"

// The buffer's consumption lock: Ordered consumption takes one message at
// a time under it (see Buffer.Lock).

// Lock takes the buffer's consumption lock, which ordered consumption holds
// while handling the queue's messages, waiting until it is free or ctx is
// done (ctx's error). It is not reentrant.
func (b *Buffer) Lock(ctx context.Context) error {
	if err := checkContext(ctx); err != nil {
		return &Error{Op: "buffer lock", Err: err}
	}
	select {
	case b.consume <- struct{}{}:
		return nil
	default:
	}
	select {
	case b.consume <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryLock takes the consumption lock if it is free and reports whether it
// did.
func (b *Buffer) TryLock() bool {
	select {
	case b.consume <- struct{}{}:
		return true
	default:
		return false
	}
}

// Unlock releases the consumption lock. Unlocking a free lock is a no-op.
func (b *Buffer) Unlock() {
	select {
	case <-b.consume:
	default:
	}
}
