package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/sqlstore"
)

// apply runs one handler call of offset through the store's transaction:
// Begin, an effect row written in the transaction from TxFrom, Commit.
func apply(ctx context.Context, e *env, topic, group string, queue int, offset int64, token uint64) error {
	hctx, tx, err := e.s.Begin(ctx, topic, group, queue, offset, token)
	if err != nil {
		return err
	}
	sqlTx, ok := sqlstore.TxFrom(hctx)
	if !ok {
		_ = tx.Rollback()
		return errors.New("no transaction in the handler's context")
	}
	if _, err := sqlTx.ExecContext(hctx, e.q("INSERT INTO "+e.effects+" (id, n) VALUES (?, ?)"), fmt.Sprintf("%s/%d/%d", topic, queue, offset), offset); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit(ctx)
}

func TestTxCommit(t *testing.T) {
	onEachDB(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.CommitFenced(ctx, "orders", "billing", 0, 0, 1))
		for _, off := range []int64{0, 1, 3, 4} {
			require.NoError(t, apply(ctx, e, "orders", "billing", 0, off, 1))
		}
		assert.Equal(t, 4, e.count(t))
		offs, err := e.s.Load(ctx, "orders", "billing", 2)
		require.NoError(t, err)
		assert.Equal(t, []int64{2, -1}, offs, "the cursor folds the contiguous finished offsets")
		off, set, err := e.s.TakeCursor(ctx, "orders", "billing", 0, 2)
		require.NoError(t, err)
		assert.Equal(t, int64(2), off)
		assert.Equal(t, []int64{3, 4}, set, "the offsets finished above the cursor are the finished set")

		// A consumer's lagging fenced commit keeps what transactions finished above it.
		require.NoError(t, e.s.CommitFenced(ctx, "orders", "billing", 0, 1, 2))
		offs, err = e.s.Load(ctx, "orders", "billing", 1)
		require.NoError(t, err)
		assert.Equal(t, []int64{2}, offs)
		require.NoError(t, apply(ctx, e, "orders", "billing", 0, 2, 2))
		offs, err = e.s.Load(ctx, "orders", "billing", 1)
		require.NoError(t, err)
		assert.Equal(t, []int64{5}, offs)
		require.NoError(t, e.s.CommitFinished(ctx, "orders", "billing", 0, 5, []int64{7}, 2))
		off, set, err = e.s.TakeCursor(ctx, "orders", "billing", 0, 2)
		require.NoError(t, err)
		assert.Equal(t, int64(5), off)
		assert.Equal(t, []int64{7}, set)
		var rows int
		require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.prefix+"finished").Scan(&rows))
		assert.Equal(t, 1, rows, "the commit trimmed the finished rows below the cursor")

		// A reset drops them all.
		require.NoError(t, apply(ctx, e, "orders", "billing", 0, 5, 2))
		require.NoError(t, e.s.Commit(ctx, "orders", "billing", 0, 0))
		offs, err = e.s.Load(ctx, "orders", "billing", 1)
		require.NoError(t, err)
		assert.Equal(t, []int64{0}, offs)
	})
}

// TestTxFenced: a handler transaction under a stale token commits
// nothing, its effects included; on PostgreSQL also when the next owner
// takes the queue while the handler runs (SQLite serializes writers: the
// take waits for the handler's transaction there).
func TestTxFenced(t *testing.T) {
	onEachDB(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		insert := e.q("INSERT INTO " + e.effects + " (id, n) VALUES (?, ?)")
		require.NoError(t, e.s.CommitFenced(ctx, "orders", "billing", 0, 0, 1))
		_, _, err := e.s.TakeCursor(ctx, "orders", "billing", 0, 2)
		require.NoError(t, err)
		err = apply(ctx, e, "orders", "billing", 0, 0, 1)
		require.ErrorIs(t, err, ferry.ErrFenced)
		assert.Equal(t, 0, e.count(t), "a fenced commit writes none of the handler's effects")

		if e.s.Dialect() == sqlstore.Postgres {
			hctx, tx, err := e.s.Begin(ctx, "orders", "billing", 0, 0, 2)
			require.NoError(t, err)
			sqlTx, ok := sqlstore.TxFrom(hctx)
			require.True(t, ok)
			_, err = sqlTx.ExecContext(hctx, insert, "late", 0)
			require.NoError(t, err)
			// The next owner takes the queue while the old one's handler runs.
			off, _, err := e.s.TakeCursor(ctx, "orders", "billing", 0, 3)
			require.NoError(t, err)
			assert.Equal(t, int64(0), off)
			require.ErrorIs(t, tx.Commit(ctx), ferry.ErrFenced)
			assert.Equal(t, 0, e.count(t), "a fenced commit writes none of the handler's effects")
			_, err = sqlTx.ExecContext(ctx, insert, "after", 0)
			require.ErrorIs(t, err, sql.ErrTxDone)
		}
		offs, err := e.s.Load(ctx, "orders", "billing", 1)
		require.NoError(t, err)
		assert.Equal(t, []int64{0}, offs)
		require.NoError(t, apply(ctx, e, "orders", "billing", 0, 0, 3))
		assert.Equal(t, 1, e.count(t))
	})
}

// TestTxTakeWaits: on PostgreSQL a take that comes while a handler's
// Commit holds the cursor row waits for it and reads its offset.
func TestTxTakeWaits(t *testing.T) {
	e := newEnv(t, openPG(t), prefixFor(t.Name()))
	ctx := context.Background()
	require.NoError(t, e.s.CommitFenced(ctx, "orders", "billing", 0, 0, 1))
	// Lock the cursor row the way a Commit in flight does, in a transaction of ours.
	hold, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = hold.ExecContext(ctx, "UPDATE "+e.prefix+"cursors SET token = token")
	require.NoError(t, err)
	took := make(chan int64, 1)
	go func() {
		off, _, err := e.s.TakeCursor(ctx, "orders", "billing", 0, 2)
		if err != nil {
			off = -100
		}
		took <- off
	}()
	_, err = hold.ExecContext(ctx, e.q("INSERT INTO "+e.prefix+"finished (topic_name, group_name, queue_no, msg_offset, handoff) VALUES (?, ?, 0, 0, 0)"), []byte("orders"), []byte("billing"))
	require.NoError(t, err)
	require.NoError(t, hold.Commit())
	assert.Equal(t, int64(1), <-took, "the take read what the transaction it waited for finished")
}

func TestTxMisuse(t *testing.T) {
	onEachDB(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		insert := e.q("INSERT INTO " + e.effects + " (id, n) VALUES (?, ?)")

		// The handler commits the transaction itself: the cursor commit
		// fails (the attempt is retried) and records nothing.
		hctx, tx, err := e.s.Begin(ctx, "orders", "billing", 0, 0, 1)
		require.NoError(t, err)
		sqlTx, _ := sqlstore.TxFrom(hctx)
		_, err = sqlTx.ExecContext(hctx, insert, "self-committed", 0)
		require.NoError(t, err)
		require.NoError(t, sqlTx.Commit())
		err = tx.Commit(ctx)
		require.ErrorIs(t, err, sqlstore.ErrTxDone)
		require.ErrorIs(t, err, sql.ErrTxDone)
		offs, err := e.s.Load(ctx, "orders", "billing", 1)
		require.NoError(t, err)
		assert.Equal(t, []int64{-1}, offs, "nothing recorded")

		// The handler rolls back itself: the same.
		hctx, tx, err = e.s.Begin(ctx, "orders", "billing", 0, 0, 1)
		require.NoError(t, err)
		sqlTx, _ = sqlstore.TxFrom(hctx)
		require.NoError(t, sqlTx.Rollback())
		require.ErrorIs(t, tx.Commit(ctx), sqlstore.ErrTxDone)
		require.NoError(t, tx.Rollback(), "Rollback after Commit does nothing")

		// Used after the call: the transaction is done, nothing written twice.
		hctx, tx, err = e.s.Begin(ctx, "orders", "billing", 0, 0, 1)
		require.NoError(t, err)
		sqlTx, _ = sqlstore.TxFrom(hctx)
		_, err = sqlTx.ExecContext(hctx, insert, "once", 0)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		_, err = sqlTx.ExecContext(ctx, insert, "twice", 0)
		require.ErrorIs(t, err, sql.ErrTxDone)
		require.ErrorIs(t, tx.Commit(ctx), sqlstore.ErrTxDone, "a second Commit")
		assert.Equal(t, 2, e.count(t), "self-committed and once")

		// The same offset finished twice: the second commit fails, its
		// effects are not applied.
		err = apply(ctx, e, "orders", "billing", 0, 0, 1)
		require.Error(t, err)
		assert.Equal(t, 2, e.count(t))

		// A rolled back transaction leaves nothing.
		hctx, tx, err = e.s.Begin(ctx, "orders", "billing", 0, 1, 1)
		require.NoError(t, err)
		sqlTx, _ = sqlstore.TxFrom(hctx)
		_, err = sqlTx.ExecContext(hctx, insert, "rolled", 1)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback())
		require.NoError(t, tx.Rollback(), "twice")
		assert.Equal(t, 2, e.count(t))

		_, ok := sqlstore.TxFrom(ctx)
		assert.False(t, ok)
		//lint:ignore SA1012 a nil context is what is tested
		_, ok = sqlstore.TxFrom(nil)
		assert.False(t, ok)
		//lint:ignore SA1012 a nil context is what is tested
		_, _, err = e.s.Begin(nil, "orders", "billing", 0, 0, 1)
		require.ErrorIs(t, err, ferry.ErrInvalidOption)
		_, _, err = e.s.Begin(ctx, "a b", "billing", 0, 0, 1)
		require.ErrorIs(t, err, ferry.ErrInvalidTopic)
		_, _, err = e.s.Begin(ctx, "orders", "billing", 0, -1, 1)
		require.ErrorIs(t, err, ferry.ErrOffsetOutOfRange)
		require.NoError(t, e.s.Close())
		_, _, err = e.s.Begin(ctx, "orders", "billing", 0, 0, 1)
		require.ErrorIs(t, err, ferry.ErrClosed)
	})
}

// TestTxConcurrent: handler transactions of one queue committing at once
// all land, each effect with its offset.
func TestTxConcurrent(t *testing.T) {
	onEachDB(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.CommitFenced(ctx, "orders", "billing", 0, 0, 1))
		const n = 40
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = apply(ctx, e, "orders", "billing", 0, int64(i), 1) })
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		assert.Equal(t, n, e.count(t))
		offs, err := e.s.Load(ctx, "orders", "billing", 1)
		require.NoError(t, err)
		assert.Equal(t, []int64{n}, offs)
	})
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	_, err := sqlstore.Open(ctx, nil)
	require.ErrorIs(t, err, sqlstore.ErrNilDB)
	db := openSQLite(t, t.TempDir())
	for _, p := range []string{"", "1x", "a-b", "x y", "drop table;", "abcdefghijabcdefghijabcdefghijabcdefghijx"} {
		_, err = sqlstore.Open(ctx, db, sqlstore.WithTablePrefix(p))
		require.ErrorIs(t, err, sqlstore.ErrInvalidPrefix, "prefix %q", p)
	}
	_, err = sqlstore.Open(ctx, db, sqlstore.WithDialect(sqlstore.Dialect(9)))
	require.ErrorIs(t, err, sqlstore.ErrUnknownDialect)
	//lint:ignore SA1012 a nil context is what is tested
	_, err = sqlstore.Open(nil, db)
	require.ErrorIs(t, err, ferry.ErrInvalidOption)
	s, err := sqlstore.Open(ctx, db, sqlstore.WithTablePrefix("My_App_"), nil)
	require.NoError(t, err)
	assert.Equal(t, sqlstore.SQLite, s.Dialect())
}

func TestResetTokens(t *testing.T) {
	onEachDB(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		require.NoError(t, e.s.CommitFenced(ctx, "orders", "billing", 0, 5, 9))
		require.ErrorIs(t, e.s.CommitFenced(ctx, "orders", "billing", 0, 6, 1), ferry.ErrFenced)
		again, err := sqlstore.Open(ctx, e.db, sqlstore.WithTablePrefix(e.prefix))
		require.NoError(t, err)
		require.ErrorIs(t, again.CommitFenced(ctx, "orders", "billing", 0, 6, 1), ferry.ErrFenced, "tokens persist")
		again, err = sqlstore.Open(ctx, e.db, sqlstore.WithTablePrefix(e.prefix), sqlstore.WithResetTokens())
		require.NoError(t, err)
		require.NoError(t, again.CommitFenced(ctx, "orders", "billing", 0, 6, 1), "a new run's first lease")
		offs, err := again.Load(ctx, "orders", "billing", 1)
		require.NoError(t, err)
		assert.Equal(t, []int64{6}, offs)
	})
}
