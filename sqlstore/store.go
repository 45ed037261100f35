package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ferrymq/ferry"
)

// Store is a [ferry.CursorStore] in two tables of an application's SQL
// database: prefix+"cursors", one row per (topic, group, queue) with the
// next offset and the fencing token of the last fenced commit, and
// prefix+"finished", the offsets above a cursor whose messages are
// finished (a handoff's finished set, and the offsets that handlers'
// transactions recorded, see [Store.Begin]). It implements
// [ferry.CursorGroups], [ferry.FencedCursorStore],
// [ferry.HandoffCursorStore] and [ferry.TxCursorStore].
//
// A Store is safe for concurrent use, and so are stores of the same tables
// in other processes: every commit is fenced inside its transaction. It
// starts no goroutine. Close does not close the *sql.DB, which stays the
// application's.
type Store struct {
	db  *sql.DB
	cfg config
	q   statements
	// commitSame is q.txCommitSame prepared at Open on SQLite: the
	// handler transactions' hot statement, parsed once per connection
	// (pgx caches its prepared statements itself). Nil on PostgreSQL.
	commitSame *sql.Stmt
	closed     atomic.Bool
}

var (
	_ ferry.CursorStore        = (*Store)(nil)
	_ ferry.CursorGroups       = (*Store)(nil)
	_ ferry.FencedCursorStore  = (*Store)(nil)
	_ ferry.HandoffCursorStore = (*Store)(nil)
)

// Open returns a store of the cursors in db, creating its tables when
// they do not exist (see [Store.Migrate]). A nil db is [ErrNilDB]; a bad
// option, [ErrInvalidPrefix] or [ErrUnknownDialect]; a nil ctx,
// [ferry.ErrInvalidOption].
//
// SQLite serializes writers: give its DSN a busy timeout (modernc.org/sqlite:
// "_pragma=busy_timeout(5000)"), and preferably WAL and immediate
// transactions ("_pragma=journal_mode(WAL)&_txlock=immediate"), or
// concurrent commits fail with SQLITE_BUSY.
func Open(ctx context.Context, db *sql.DB, opts ...Option) (*Store, error) {
	if ctx == nil {
		return nil, &ferry.Error{Op: "open sqlstore", Err: fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)}
	}
	if db == nil {
		return nil, &ferry.Error{Op: "open sqlstore", Err: ErrNilDB}
	}
	cfg, err := newConfig(db, opts)
	if err != nil {
		return nil, &ferry.Error{Op: "open sqlstore", Err: err}
	}
	s := &Store{db: db, cfg: cfg, q: newStatements(cfg)}
	if err := s.Migrate(ctx); err != nil {
		return nil, err
	}
	if cfg.dialect == SQLite {
		if s.commitSame, err = db.PrepareContext(ctx, s.q.txCommitSame); err != nil {
			return nil, &ferry.Error{Op: "open sqlstore: prepare", Err: err}
		}
	}
	if cfg.resetTokens {
		if _, err := db.ExecContext(ctx, rebind(cfg.dialect, "UPDATE "+cfg.prefix+"cursors SET token = ?"), encToken(0)); err != nil {
			_ = s.Close()
			return nil, &ferry.Error{Op: "open sqlstore: reset tokens", Err: err}
		}
	}
	return s, nil
}

// Migrate creates the store's tables if they do not exist; it is
// idempotent, and [Open] calls it. Applications that manage their schema
// themselves can take the statements from [Schema].
func (s *Store) Migrate(ctx context.Context) error {
	const op = "migrate sqlstore"
	if err := s.check(ctx, op); err != nil {
		return err
	}
	for _, stmt := range Schema(s.cfg.dialect, s.cfg.prefix) {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return &ferry.Error{Op: op, Err: err}
		}
	}
	return nil
}

// Schema returns the statements that create the tables of a store of
// dialect with table prefix prefix (see [WithTablePrefix]), each
// "CREATE TABLE IF NOT EXISTS". The prefix is not checked.
func Schema(d Dialect, prefix string) []string {
	// On SQLite, WITHOUT ROWID keeps each table in one b-tree, its
	// primary key's: a commit writes half the pages.
	bin, tail := "BLOB", " WITHOUT ROWID"
	if d == Postgres {
		bin, tail = "BYTEA", ""
	}
	return []string{
		"CREATE TABLE IF NOT EXISTS " + prefix + "cursors (" +
			"topic_name " + bin + " NOT NULL, " +
			"group_name " + bin + " NOT NULL, " +
			"queue_no INTEGER NOT NULL, " +
			"next_offset BIGINT NOT NULL, " +
			"token BIGINT NOT NULL, " +
			"PRIMARY KEY (topic_name, group_name, queue_no))" + tail,
		"CREATE TABLE IF NOT EXISTS " + prefix + "finished (" +
			"topic_name " + bin + " NOT NULL, " +
			"group_name " + bin + " NOT NULL, " +
			"queue_no INTEGER NOT NULL, " +
			"msg_offset BIGINT NOT NULL, " +
			"handoff SMALLINT NOT NULL, " +
			"PRIMARY KEY (topic_name, group_name, queue_no, msg_offset))" + tail,
	}
}

// Tokens are uint64; the column is a signed BIGINT. Flipping the top bit
// maps one onto the other keeping the order.
func encToken(t uint64) int64 { return int64(t ^ 1<<63) }

// statements are the store's SQL, in its dialect.
type statements struct {
	commit, commitFenced, takeToken string
	clearAll, clearFenced           string
	insertSet, insertSetBatch       string
	insertTx                        string
	// txCommit, on Postgres only, is the fenced token raise and insertTx
	// in one statement (one round trip): it inserts no row when fenced.
	txCommit string
	// txCommitSame is the handler transaction's commit for the common
	// case of a token equal to the stored one, one statement: it inserts
	// the finished row only if the token is the stored one, without
	// writing the cursor row (see txCommitSame).
	txCommitSame                    string
	loadGroup, loadTopic, loadQueue string
	forget                          []string
}

func newStatements(c config) statements {
	cur, fin := c.prefix+"cursors", c.prefix+"finished"
	key := "topic_name = ? AND group_name = ? AND queue_no = ?"
	upsert := "INSERT INTO " + cur + " (topic_name, group_name, queue_no, next_offset, token) VALUES (?, ?, ?, ?, ?) " +
		"ON CONFLICT (topic_name, group_name, queue_no) DO UPDATE SET "
	r := func(q string) string { return rebind(c.dialect, q) }
	return statements{
		commit:       r(upsert + "next_offset = excluded.next_offset"),
		commitFenced: r(upsert + "next_offset = excluded.next_offset, token = excluded.token WHERE " + cur + ".token <= excluded.token"),
		takeToken:    r(upsert + "token = excluded.token WHERE " + cur + ".token <= excluded.token"),
		clearAll:     r("DELETE FROM " + fin + " WHERE " + key),
		clearFenced:  r("DELETE FROM " + fin + " WHERE " + key + " AND (handoff = 1 OR msg_offset < ?)"),
		insertSet: r("INSERT INTO " + fin + " (topic_name, group_name, queue_no, msg_offset, handoff) VALUES (?, ?, ?, ?, 1) " +
			"ON CONFLICT (topic_name, group_name, queue_no, msg_offset) DO NOTHING"),
		insertSetBatch: r("INSERT INTO " + fin + " (topic_name, group_name, queue_no, msg_offset, handoff) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, 1), ", setBatch), ", ") +
			" ON CONFLICT (topic_name, group_name, queue_no, msg_offset) DO NOTHING"),
		insertTx:     r("INSERT INTO " + fin + " (topic_name, group_name, queue_no, msg_offset, handoff) VALUES (?, ?, ?, ?, 0)"),
		txCommitSame: txCommitSame(c.dialect, cur, fin),
		txCommit: "WITH fence AS (INSERT INTO " + cur + " (topic_name, group_name, queue_no, next_offset, token) VALUES ($1, $2, $3, -1, $4) " +
			"ON CONFLICT (topic_name, group_name, queue_no) DO UPDATE SET token = excluded.token WHERE " + cur + ".token <= excluded.token RETURNING 1) " +
			"INSERT INTO " + fin + " (topic_name, group_name, queue_no, msg_offset, handoff) SELECT $1, $2, $3, $5, 0 FROM fence",
		// One statement each: one snapshot of the cursor and its
		// finished rows, whatever the isolation level.
		loadGroup: r("SELECT queue_no, next_offset, 0 FROM " + cur + " WHERE topic_name = ? AND group_name = ? AND queue_no < ? " +
			"UNION ALL SELECT queue_no, msg_offset, 1 FROM " + fin + " WHERE topic_name = ? AND group_name = ? AND queue_no < ?"),
		loadTopic: r("SELECT group_name, queue_no, next_offset, 0 FROM " + cur + " WHERE topic_name = ? " +
			"UNION ALL SELECT group_name, queue_no, msg_offset, 1 FROM " + fin + " WHERE topic_name = ? AND queue_no < ?"),
		loadQueue: r("SELECT next_offset, 0 FROM " + cur + " WHERE " + key +
			" UNION ALL SELECT msg_offset, 1 FROM " + fin + " WHERE " + key),
		forget: []string{
			r("DELETE FROM " + cur + " WHERE topic_name = ? AND group_name = ?"),
			r("DELETE FROM " + fin + " WHERE topic_name = ? AND group_name = ?"),
		},
	}
}

// txCommitSame returns the statement that records a handler
// transaction's offset finished ($5) when the queue's stored token is $4,
// in one round trip and without writing the cursor row. On PostgreSQL it
// share-locks the row: a take's raise of the token (an UPDATE) waits for
// the transaction, and handler transactions of the queue share the lock.
// SQLite serializes writers: its write lock does the same.
func txCommitSame(d Dialect, cur, fin string) string {
	lock := ""
	if d == Postgres {
		lock = " FOR SHARE"
	}
	q := "INSERT INTO " + fin + " (topic_name, group_name, queue_no, msg_offset, handoff) " +
		"SELECT $1, $2, $3, $5, 0 FROM (SELECT 1 FROM " + cur +
		" WHERE topic_name = $1 AND group_name = $2 AND queue_no = $3 AND token = $4" + lock + ") AS fence"
	if d == SQLite {
		q = strings.NewReplacer("$1", "?1", "$2", "?2", "$3", "?3", "$4", "?4", "$5", "?5").Replace(q)
	}
	return q
}

// rebind rewrites the ? placeholders of q as $1, $2, ... for Postgres.
// The store's statements hold no ? in literals.
func rebind(d Dialect, q string) string {
	if d != Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// check is the checks every call starts with: a non-nil ctx, not done,
// and the store open.
func (s *Store) check(ctx context.Context, op string) error {
	if ctx == nil {
		return &ferry.Error{Op: op, Err: fmt.Errorf("%w: nil context", ferry.ErrInvalidOption)}
	}
	if s.closed.Load() {
		return &ferry.Error{Op: op, Err: ferry.ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return &ferry.Error{Op: op, Err: err}
	}
	return nil
}

// inTx runs f in a transaction of the store's own and commits it.
func (s *Store) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// fold advances cursor past the contiguous offsets of finished (sorted)
// and returns it with the rest of the set above it, nil when empty. A
// cursor of -1 (nothing committed) is not advanced: where the queue
// started is not known.
func fold(cursor int64, finished []int64) (int64, []int64) {
	if cursor >= 0 {
		i := 0
		for i < len(finished) && finished[i] <= cursor {
			if finished[i] == cursor {
				cursor++
			}
			i++
		}
		finished = finished[i:]
	}
	if len(finished) == 0 {
		return cursor, nil
	}
	return cursor, slices.Clone(finished)
}

// Load implements [ferry.CursorStore]. The offsets are the committed
// cursors advanced past the contiguous offsets that handlers'
// transactions finished (see [Store.Begin]).
func (s *Store) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	const op = "load cursor"
	if err := s.check(ctx, op); err != nil {
		return nil, err
	}
	if err := ferry.ValidateGroupCursorArgs(topic, group, queues); err != nil {
		return nil, &ferry.Error{Op: op, Err: err}
	}
	t, g := []byte(topic), []byte(group)
	rows, err := s.db.QueryContext(ctx, s.q.loadGroup, t, g, queues, t, g, queues)
	if err != nil {
		return nil, &ferry.Error{Op: op, Err: err}
	}
	qs := newQueueRows()
	for rows.Next() {
		var q int
		var off int64
		var kind int
		if err := rows.Scan(&q, &off, &kind); err != nil {
			_ = rows.Close()
			return nil, &ferry.Error{Op: op, Err: err}
		}
		qs.add(q, off, kind)
	}
	if err := rows.Err(); err != nil {
		return nil, &ferry.Error{Op: op, Err: err}
	}
	return qs.offsets(queues)
}

// queueRows collects the rows of one group's queues.
type queueRows struct {
	cursor   map[int]int64
	finished map[int][]int64
}

func newQueueRows() *queueRows {
	return &queueRows{cursor: map[int]int64{}, finished: map[int][]int64{}}
}

func (r *queueRows) add(q int, off int64, kind int) {
	if kind == 0 {
		r.cursor[q] = off
		return
	}
	r.finished[q] = append(r.finished[q], off)
}

// offsets returns the folded cursors of queues queues.
func (r *queueRows) offsets(queues int) ([]int64, error) {
	out := make([]int64, queues)
	for i := range out {
		out[i] = -1
	}
	for q, off := range r.cursor {
		if q < 0 || q >= queues {
			return nil, fmt.Errorf("%w: queue %d", ErrCorrupt, q)
		}
		fin := r.finished[q]
		slices.Sort(fin)
		out[q], _ = fold(off, fin)
	}
	return out, nil
}

// Commit implements [ferry.CursorStore]: an operator's reset. It keeps
// the queue's token and forgets every finished offset of the queue, those
// of a handoff and those handlers' transactions recorded: the messages
// from offset on are delivered again.
func (s *Store) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	const op = "commit cursor"
	if err := s.checkCommit(ctx, op, topic, group, queue, offset); err != nil {
		return err
	}
	t, g := []byte(topic), []byte(group)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q.commit, t, g, queue, offset, encToken(0)); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.q.clearAll, t, g, queue)
		return err
	})
	if err != nil {
		return &ferry.Error{Op: op, Err: err}
	}
	return nil
}

func (s *Store) checkCommit(ctx context.Context, op, topic, group string, queue int, offset int64) error {
	if err := s.check(ctx, op); err != nil {
		return err
	}
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return &ferry.Error{Op: op, Err: err}
	}
	if offset < 0 {
		return &ferry.Error{Op: op, Err: fmt.Errorf("%w: offset %d", ferry.ErrOffsetOutOfRange, offset)}
	}
	return nil
}

// CommitFenced implements [ferry.FencedCursorStore]. It empties the
// queue's handoff set, and trims the offsets handlers' transactions
// recorded below offset; those at or above it stay (see [Store.Load]).
func (s *Store) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	const op = "commit cursor"
	if err := s.checkCommit(ctx, op, topic, group, queue, offset); err != nil {
		return err
	}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		return s.commitFencedTx(ctx, tx, topic, group, queue, offset, token)
	})
	if err != nil {
		return s.fencedErr(op, topic, group, queue, err)
	}
	return nil
}

// errStale marks a fenced write refused inside commitFencedTx and
// takeTx; fencedErr turns it into ErrFenced.
type errStale struct{ token uint64 }

func (e errStale) Error() string { return fmt.Sprintf("token %d", e.token) }

func (s *Store) fencedErr(op, topic, group string, queue int, err error) error {
	var st errStale
	if errors.As(err, &st) {
		return &ferry.Error{Op: fmt.Sprintf("%s %s/%s[%d]", op, topic, group, queue), Err: fmt.Errorf("%w: token %d stale", ferry.ErrFenced, st.token)}
	}
	return &ferry.Error{Op: op, Err: err}
}

// commitFencedTx writes offset to the queue's cursor, fenced by token,
// and trims its finished rows, in tx.
func (s *Store) commitFencedTx(ctx context.Context, tx *sql.Tx, topic, group string, queue int, offset int64, token uint64) error {
	t, g := []byte(topic), []byte(group)
	if err := fencedExec(ctx, tx, token, s.q.commitFenced, t, g, queue, offset, encToken(token)); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, s.q.clearFenced, t, g, queue, offset)
	return err
}

// fencedExec runs a fenced upsert, which changes no row when the stored
// token is above token: errStale.
func fencedExec(ctx context.Context, tx *sql.Tx, token uint64, q string, args ...any) error {
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return errStale{token}
	}
	return nil
}

// Cursors implements [ferry.CursorGroups].
func (s *Store) Cursors(ctx context.Context, topic string, queues int) (ferry.Cursors, error) {
	const op = "list cursors"
	if err := s.check(ctx, op); err != nil {
		return ferry.Cursors{}, err
	}
	if err := ferry.ValidateTopicCursorsArgs(topic, queues); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: op, Err: err}
	}
	t := []byte(topic)
	rows, err := s.db.QueryContext(ctx, s.q.loadTopic, t, t, queues)
	if err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: op, Err: err}
	}
	groups := map[string]*queueRows{}
	for rows.Next() {
		var g []byte
		var q, kind int
		var off int64
		if err := rows.Scan(&g, &q, &off, &kind); err != nil {
			_ = rows.Close()
			return ferry.Cursors{}, &ferry.Error{Op: op, Err: err}
		}
		r := groups[string(g)]
		if r == nil {
			r = newQueueRows()
			groups[string(g)] = r
		}
		if kind == 0 && q >= queues {
			continue // a queue past those asked for
		}
		r.add(q, off, kind)
	}
	if err := rows.Err(); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: op, Err: err}
	}
	out := ferry.Cursors{Topic: topic, Groups: make(map[string]ferry.Cursor, len(groups))}
	for g, r := range groups {
		offs, err := r.offsets(queues)
		if err != nil {
			return ferry.Cursors{}, &ferry.Error{Op: op, Err: err}
		}
		out.Groups[g] = ferry.Cursor{Group: g, Offsets: offs}
	}
	return out, nil
}

// Forget implements [ferry.CursorGroups]: it deletes the group's rows on
// topic, tokens and finished offsets included.
func (s *Store) Forget(ctx context.Context, topic, group string) error {
	const op = "forget cursor"
	if err := s.check(ctx, op); err != nil {
		return err
	}
	if err := ferry.ValidateGroupCursorArgs(topic, group, 0); err != nil {
		return &ferry.Error{Op: op, Err: err}
	}
	t, g := []byte(topic), []byte(group)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for _, q := range s.q.forget {
			if _, err := tx.ExecContext(ctx, q, t, g); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return &ferry.Error{Op: op, Err: err}
	}
	return nil
}

// Close marks the store closed: every later call but Close is
// [ferry.ErrClosed]. It does not close the *sql.DB. Idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) || s.commitSame == nil {
		return nil
	}
	return s.commitSame.Close()
}

// Dialect returns the store's SQL dialect (detected or set).
func (s *Store) Dialect() Dialect { return s.cfg.dialect }

// Rebind rewrites the ? placeholders of query for dialect d: $1, $2, ...
// for [Postgres], unchanged for [SQLite]. It does not parse SQL: a ? in a
// literal or a comment is rewritten too. A helper for handlers that write
// portable effects.
func Rebind(d Dialect, query string) string { return rebind(d, query) }
