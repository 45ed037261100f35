package sqlstore

import "errors"

var (
	// ErrNilDB is returned by [Open] given a nil *sql.DB.
	ErrNilDB = errors.New("sqlstore: nil *sql.DB")
	// ErrUnknownDialect is returned by [Open] when the database's driver is
	// not one it recognises and no [WithDialect] names the dialect.
	ErrUnknownDialect = errors.New("sqlstore: unknown SQL dialect (set WithDialect)")
	// ErrInvalidPrefix is returned by [Open] given a table prefix that is not
	// an unquoted SQL identifier: 1 to 40 ASCII letters, digits and
	// underscores, not starting with a digit.
	ErrInvalidPrefix = errors.New("sqlstore: invalid table prefix")
	// ErrTxDone is returned by a [ferry.CursorTx]'s Commit when the handler's
	// transaction was already committed or rolled back (by the handler
	// itself, through [TxFrom]), or by a second Commit: the cursor was not
	// recorded, and the attempt fails (see the package doc on exactly-once).
	ErrTxDone = errors.New("sqlstore: the handler's transaction is already committed or rolled back")
	// ErrCorrupt is returned when a row of the store's tables holds what
	// the store never writes (a queue out of range, say).
	ErrCorrupt = errors.New("sqlstore: corrupt cursor row")
)
