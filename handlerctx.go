package ferry

import (
	"context"
	"errors"
	"fmt"
)

// handlerCtx is the context of a handler call: it never changes once
// handed out, so it stays as it was when the call returns, for a
// goroutine the handler started that still reads it (a database driver's
// statement watcher, say), while the worker goes on with other messages.
// Calls with the same context and Delivery share one.
type handlerCtx struct {
	context.Context
	d Delivery
}

func (c *handlerCtx) Value(key any) any {
	if key == (deliveryKey{}) {
		return &c.d
	}
	return c.Context.Value(key)
}

// callTx is call in a transaction of the cursor store (see
// [TxCursorStore]): msg's offset finishes in it when the handler
// succeeds; a failed Begin or Commit fails the attempt.
func (d *deliverer) callTx(dctx *deliveryCtx, hc *handlerCtx, r *queueRun, msg, view *EnhancedMessage) error {
	m := d.m
	ctx, tx, err := d.txs.Begin(hc, m.topic, m.scope, r.q, msg.Offset, r.lease.Token())
	if err != nil {
		dctx.failed++
		return &Error{Op: fmt.Sprintf("begin handler transaction at %s offset %d", r.id, msg.Offset), Err: err}
	}
	if hs := m.hooks; hs != nil && (len(hs.handle) > 0 || len(hs.handled) > 0) {
		err = d.callHooked(hs, dctx, ctx, view)
	} else {
		err = d.safeHandle(dctx, ctx, view)
	}
	if err != nil {
		if rerr := tx.Rollback(); rerr != nil {
			m.report(&Error{Op: fmt.Sprintf("roll back handler transaction at %s offset %d", r.id, msg.Offset), Err: rerr})
		}
		return err
	}
	if err := tx.Commit(r.hctx); err != nil {
		if errors.Is(err, ErrFenced) {
			r.lose()
		}
		dctx.handled--
		dctx.failed++
		return &Error{Op: fmt.Sprintf("commit handler transaction at %s offset %d", r.id, msg.Offset), Err: err}
	}
	return nil
}
