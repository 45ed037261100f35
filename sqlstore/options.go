package sqlstore

import (
	"database/sql"
	"fmt"
	"reflect"
	"strings"
)

// Dialect is the SQL dialect the store writes: where the two differ, the
// placeholders (? or $1) and the binary column type (BLOB or BYTEA).
type Dialect int

const (
	// DetectDialect, the default, picks the dialect from the package of the
	// database's driver: modernc.org/sqlite and github.com/mattn/go-sqlite3
	// are [SQLite]; github.com/jackc/pgx and github.com/lib/pq are
	// [Postgres]; any other is [ErrUnknownDialect].
	DetectDialect Dialect = iota
	// SQLite: SQLite 3.35 or later.
	SQLite
	// Postgres: PostgreSQL 9.5 or later.
	Postgres
)

func (d Dialect) String() string {
	switch d {
	case DetectDialect:
		return "detect"
	case SQLite:
		return "sqlite"
	case Postgres:
		return "postgres"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Option configures [Open].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	dialect     Dialect
	prefix      string
	resetTokens bool
}

// WithDialect sets the SQL dialect. Default: [DetectDialect].
func WithDialect(d Dialect) Option { return optionFunc(func(c *config) { c.dialect = d }) }

// WithTablePrefix sets the prefix of the store's table names: the store
// keeps its cursors in prefix+"cursors" and the finished offsets in
// prefix+"finished". Stores with different prefixes on one database are
// independent. Default: "ferry_".
func WithTablePrefix(prefix string) Option {
	return optionFunc(func(c *config) { c.prefix = prefix })
}

// WithResetTokens makes [Open] reset every fencing token stored in the
// tables to 0, for a process that uses them alone with the broker's
// in-process coordinator: its tokens start again at 1 with the process,
// and the tokens a previous run stored (raised by rebalances) would fence
// the new run's first commits until its leases caught up. Never with
// tables that processes share: their coordinator's tokens must outlive
// each of them (natsstore's do), and a reset lets a stale owner commit.
// Default: off (tokens persist).
func WithResetTokens() Option { return optionFunc(func(c *config) { c.resetTokens = true }) }

// newConfig applies opts over the defaults and validates the result.
func newConfig(db *sql.DB, opts []Option) (config, error) {
	c := config{dialect: DetectDialect, prefix: "ferry_"}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if !validPrefix(c.prefix) {
		return c, fmt.Errorf("%w: %q", ErrInvalidPrefix, c.prefix)
	}
	switch c.dialect {
	case SQLite, Postgres:
	case DetectDialect:
		c.dialect = detect(db)
		if c.dialect == DetectDialect {
			return c, fmt.Errorf("%w: driver %T", ErrUnknownDialect, db.Driver())
		}
	default:
		return c, fmt.Errorf("%w: %v", ErrUnknownDialect, c.dialect)
	}
	return c, nil
}

func validPrefix(p string) bool {
	if p == "" || len(p) > 40 || (p[0] >= '0' && p[0] <= '9') {
		return false
	}
	for i := 0; i < len(p); i++ {
		b := p[i]
		if b != '_' && (b < '0' || b > '9') && (b < 'a' || b > 'z') && (b < 'A' || b > 'Z') {
			return false
		}
	}
	return true
}

// detect names the dialect of db's driver by its package, DetectDialect
// when it knows none.
func detect(db *sql.DB) Dialect {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return DetectDialect
	}
	pkg := t.PkgPath()
	switch {
	case strings.Contains(pkg, "sqlite"):
		return SQLite
	case strings.Contains(pkg, "jackc/pgx"), strings.HasSuffix(pkg, "lib/pq"):
		return Postgres
	}
	return DetectDialect
}
