package sqlstore

import (
	"context"
	"database/sql"
	"slices"

	"github.com/ferrymq/ferry"
)

// setBatch is how many offsets of a finished set one INSERT writes.
const setBatch = 200

// TakeCursor implements [ferry.HandoffCursorStore]. In one transaction it
// raises the queue's token (the row lock it takes waits for a commit of
// the old owner in flight, which then lands before the read or is
// refused), then reads the cursor and the finished offsets, handoff set
// and handlers' transactions alike, folded as [Store.Load] folds them.
func (s *Store) TakeCursor(ctx context.Context, topic, group string, queue int, token uint64) (int64, []int64, error) {
	const op = "take cursor"
	if err := s.check(ctx, op); err != nil {
		return 0, nil, err
	}
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return 0, nil, &ferry.Error{Op: op, Err: err}
	}
	t, g := []byte(topic), []byte(group)
	var cursor int64
	var finished []int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := fencedExec(ctx, tx, token, s.q.takeToken, t, g, queue, int64(-1), encToken(token)); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, s.q.loadQueue, t, g, queue, t, g, queue)
		if err != nil {
			return err
		}
		defer rows.Close()
		cursor, finished = -1, nil
		for rows.Next() {
			var off int64
			var kind int
			if err := rows.Scan(&off, &kind); err != nil {
				return err
			}
			if kind == 0 {
				cursor = off
			} else {
				finished = append(finished, off)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return 0, nil, s.fencedErr(op, topic, group, queue, err)
	}
	slices.Sort(finished)
	cursor, finished = fold(cursor, finished)
	return cursor, finished, nil
}

// CommitFinished implements [ferry.HandoffCursorStore]: the fenced commit
// of [Store.CommitFenced], and the queue's handoff set replaced by
// finished, in one transaction.
func (s *Store) CommitFinished(ctx context.Context, topic, group string, queue int, offset int64, finished []int64, token uint64) error {
	const op = "commit cursor"
	if err := s.checkCommit(ctx, op, topic, group, queue, offset); err != nil {
		return err
	}
	if err := ferry.ValidateFinishedSet(offset, finished); err != nil {
		return &ferry.Error{Op: op, Err: err}
	}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.commitFencedTx(ctx, tx, topic, group, queue, offset, token); err != nil {
			return err
		}
		return s.insertSet(ctx, tx, topic, group, queue, finished)
	})
	if err != nil {
		return s.fencedErr(op, topic, group, queue, err)
	}
	return nil
}

// insertSet writes finished as the queue's handoff set, setBatch rows a
// statement.
func (s *Store) insertSet(ctx context.Context, tx *sql.Tx, topic, group string, queue int, finished []int64) error {
	if len(finished) == 0 {
		return nil
	}
	t, g := []byte(topic), []byte(group)
	one := s.q.insertSet
	for chunk := range slices.Chunk(finished, setBatch) {
		if len(chunk) < setBatch {
			for _, o := range chunk {
				if _, err := tx.ExecContext(ctx, one, t, g, queue, o); err != nil {
					return err
				}
			}
			continue
		}
		args := make([]any, 0, 4*len(chunk))
		for _, o := range chunk {
			args = append(args, t, g, queue, o)
		}
		if _, err := tx.ExecContext(ctx, s.q.insertSetBatch, args...); err != nil {
			return err
		}
	}
	return nil
}
