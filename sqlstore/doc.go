// Package sqlstore keeps a Ferry consumer group's cursors in the
// application's own SQL database, so that a handler's effects and the
// cursor commit of its message land in one transaction: each message's
// effects exactly once, whatever crashes.
//
// It depends on [database/sql] only: open the database with the driver of
// your choice and give the *sql.DB to [Open]. Tested with
// modernc.org/sqlite (SQLite) and github.com/jackc/pgx/v5/stdlib
// (PostgreSQL).
//
//	db, _ := sql.Open("sqlite", "file:app.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
//	cursors, _ := sqlstore.Open(ctx, db)
//	b, _ := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(cursors))
//	c, _ := b.NewConsumer("ledger", "transfers", ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
//		tx, _ := sqlstore.TxFrom(ctx)
//		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - ? WHERE name = ?", amount, from)
//		return err // nil: the consumer commits tx with the message's offset; an error rolls it back
//	}))
//
// # Dialects
//
// The store writes portable SQL (upserts with ON CONFLICT, SQLite 3.35 or
// later, PostgreSQL 9.5 or later); where dialects differ (placeholders ?
// or $1, BLOB or BYTEA, and one PostgreSQL-only statement that saves a
// round trip) it follows the [Dialect], detected from the driver's package
// unless [WithDialect] names it. [Rebind] rewrites a handler's ? queries
// for the store's dialect.
//
// # Tables
//
// [Open] creates two tables when they do not exist ([Store.Migrate];
// [Schema] gives the statements): prefix+"cursors", one row per (topic,
// group, queue) with the next offset and the fencing token of the last
// fenced commit, and prefix+"finished", the offsets above a cursor whose
// messages finished (a handoff's finished set, and the offsets handlers'
// transactions recorded). The prefix is "ferry_" unless
// [WithTablePrefix] sets another. Topic and group names are stored as
// bytes (BLOB, BYTEA): any name Ferry accepts round-trips.
//
// # Transactions and exactly-once
//
// [Store] implements [ferry.TxCursorStore]: a push consumer calls
// [Store.Begin] before each handler call, and the handler finds the
// transaction with [TxFrom]. When the handler returns nil the consumer
// commits it: the store checks the queue's lease token (a stale one is
// [ferry.ErrFenced], and nothing of the transaction is written, the
// handler's effects included), records the offset finished, and commits,
// in the one transaction. A handler error or panic rolls it back. Load and
// TakeCursor advance the cursor past the contiguous finished offsets; the
// consumer's own fenced commits trim the rows below its cursor.
//
// Fencing is inside the transaction. On PostgreSQL the commit locks the
// queue's cursor row, so a take of the queue by the next owner (which
// raises the token on the same row) either comes after the commit and
// reads its offset, or comes first and the commit is refused. SQLite
// serializes writers: with _txlock=immediate, a handler's transaction
// holds the database's write lock from Begin to its end, so handlers of
// one SQLite database run one at a time (keep them short, and the busy
// timeout above the longest).
//
// What breaks exactly-once: a handler that commits or rolls back the
// transaction itself. The cursor commit then fails with [ErrTxDone] and
// the attempt is retried; if the handler had committed, its effects stand
// without the offset, and the retry applies them again (Rollback reports
// [ErrTxDone] as well, for the consumer to report). The transaction is
// the handler's for the length of the call only: used after the handler
// returned, it is done ([sql.ErrTxDone]) and writes nothing. Effects
// outside the database (an e-mail, an HTTP call) are at least once, as
// ever.
//
// # Tokens
//
// Tokens persist with the cursors, as stores shared by processes need:
// use a coordinator whose tokens outlive its processes (natsstore's). A
// single process using the broker's in-process coordinator, whose tokens
// start again at 1 with every run, opens the store with
// [WithResetTokens].
//
// # Tests
//
// `go test -race ./...` in this module runs ferrytest.TestCursorStore,
// the transaction tests, a consumer test, a crash test (SIGKILLed
// consumers) and the ledger example on SQLite, and the same on a
// PostgreSQL server the tests start themselves: they look for initdb and
// postgres in $FERRY_PG_BIN, on $PATH and in /usr/lib/postgresql/*/bin,
// initdb a temporary directory and run the server on a free port with
// its unix socket there (as root, as the user postgres). Without a
// server they skip the PostgreSQL tests, saying so on stderr. On Debian,
// `apt-get install postgresql` brings one.
package sqlstore
