package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/ferrymq/ferry"
)

var _ ferry.TxCursorStore = (*Store)(nil)

// txKey is the context key of a handler's transaction.
type txKey struct{}

// TxFrom returns the transaction of the handler call ctx belongs to: a
// consumer whose cursor store is a [Store] runs each handler call with
// one (see [Store.Begin]). The handler writes its effects in it and
// neither commits nor rolls it back: the consumer does, with the
// message's offset recorded as finished in the same transaction. ok is
// false for a ctx of no handler call of a Store. Used after the handler
// returned, the transaction is done: its methods return [sql.ErrTxDone].
func TxFrom(ctx context.Context) (tx *sql.Tx, ok bool) {
	if ctx == nil {
		return nil, false
	}
	tx, ok = ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok && tx != nil
}

// Begin implements [ferry.TxCursorStore]: it begins a transaction on the
// store's database for the handler call of offset of (topic, group,
// queue), put in the returned context for [TxFrom]. The transaction does
// not end with ctx (the consumer ends it with Commit or Rollback); the
// handler's statements should take ctx.
//
// The returned [ferry.CursorTx]'s Commit, in the transaction: raises the
// queue's token to token, or finds it above and returns [ferry.ErrFenced]
// (PostgreSQL: a share lock on the cursor row orders it with a TakeCursor of
// the next owner; SQLite serializes writers); records offset as finished
// (an offset already recorded fails the commit: its effects are not
// applied twice); and commits. On any failure it rolls back. A second
// Commit, or a Commit of a transaction the handler committed or rolled
// back itself, is [ErrTxDone] (see the package doc: the effects a handler
// committed itself are not exactly-once). Rollback rolls back; after a
// Commit it does nothing and returns nil.
func (s *Store) Begin(ctx context.Context, topic, group string, queue int, offset int64, token uint64) (context.Context, ferry.CursorTx, error) {
	const op = "begin handler transaction"
	if err := s.checkCommit(ctx, op, topic, group, queue, offset); err != nil {
		return nil, nil, err
	}
	tx, err := s.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, nil, &ferry.Error{Op: op, Err: err}
	}
	ct := &cursorTx{s: s, tx: tx, topic: topic, group: group, queue: queue, offset: offset, token: token}
	return &txCtx{Context: ctx, done: ctx.Done(), tx: tx}, ct, nil
}

// txCtx is the handler's context with its transaction. Its Done channel
// is read once, at Begin: a goroutine that a driver starts per statement
// to watch the context (modernc.org/sqlite's does) may read it after the
// handler returned, when the consumer reuses the context it was given
// for the next call.
type txCtx struct {
	context.Context
	done <-chan struct{}
	tx   *sql.Tx
}

func (c *txCtx) Done() <-chan struct{} { return c.done }

func (c *txCtx) Value(key any) any {
	if key == (txKey{}) {
		return c.tx
	}
	return c.Context.Value(key)
}

// cursorTx is one handler call's transaction. Its methods are safe for
// concurrent use; the first of Commit and Rollback ends it.
type cursorTx struct {
	s            *Store
	tx           *sql.Tx
	topic, group string
	queue        int
	offset       int64
	token        uint64

	mu   sync.Mutex // guards done
	done bool       // Commit or Rollback was called
}

// Commit implements [ferry.CursorTx].
func (c *cursorTx) Commit(ctx context.Context) error {
	op := fmt.Sprintf("commit handler transaction %s/%s[%d] offset %d", c.topic, c.group, c.queue, c.offset)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return &ferry.Error{Op: op, Err: fmt.Errorf("%w: Commit after Commit or Rollback", ErrTxDone)}
	}
	c.done = true
	if err := c.s.check(ctx, op); err != nil {
		_ = c.tx.Rollback()
		return err
	}
	if err := c.commit(ctx); err != nil {
		_ = c.tx.Rollback()
		if errors.Is(err, sql.ErrTxDone) {
			return &ferry.Error{Op: op, Err: fmt.Errorf("%w (by the handler?): %w", ErrTxDone, err)}
		}
		return c.s.fencedErr(op, c.topic, c.group, c.queue, err)
	}
	return nil
}

func (c *cursorTx) commit(ctx context.Context) error {
	s := c.s
	t, g := []byte(c.topic), []byte(c.group)
	// The usual case, one statement: the token is the stored one.
	var res sql.Result
	var err error
	if s.commitSame != nil {
		res, err = c.tx.StmtContext(ctx, s.commitSame).ExecContext(ctx, t, g, c.queue, encToken(c.token), c.offset)
	} else {
		res, err = c.tx.ExecContext(ctx, s.q.txCommitSame, t, g, c.queue, encToken(c.token), c.offset)
	}
	if err != nil {
		return fmt.Errorf("record offset finished (finished already?): %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		// A new token (raised, or fenced), or no cursor row yet.
		if s.cfg.dialect == Postgres {
			if err := fencedExec(ctx, c.tx, c.token, s.q.txCommit, t, g, c.queue, encToken(c.token), c.offset); err != nil {
				return err
			}
			return c.tx.Commit()
		}
		if err := fencedExec(ctx, c.tx, c.token, s.q.takeToken, t, g, c.queue, int64(-1), encToken(c.token)); err != nil {
			return err
		}
		if _, err := c.tx.ExecContext(ctx, s.q.insertTx, t, g, c.queue, c.offset); err != nil {
			return fmt.Errorf("record offset finished (finished already?): %w", err)
		}
	}
	return c.tx.Commit()
}

// Rollback implements [ferry.CursorTx]. A transaction the handler ended
// itself is [ErrTxDone]: if the handler committed it, its effects stand
// while the message is delivered again.
func (c *cursorTx) Rollback() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	c.done = true
	if err := c.tx.Rollback(); err != nil {
		op := fmt.Sprintf("roll back handler transaction %s/%s[%d] offset %d", c.topic, c.group, c.queue, c.offset)
		if errors.Is(err, sql.ErrTxDone) {
			return &ferry.Error{Op: op, Err: fmt.Errorf("%w (by the handler?): %w", ErrTxDone, err)}
		}
		return &ferry.Error{Op: op, Err: err}
	}
	return nil
}
