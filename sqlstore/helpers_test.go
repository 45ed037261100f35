package sqlstore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/sqlstore"
)

// env is one database for a test: its *sql.DB, a store on it with tables
// of the test's own, and an effects table beside them.
type env struct {
	db      *sql.DB
	s       *sqlstore.Store
	prefix  string
	effects string // the effects table: id TEXT PRIMARY KEY, n INTEGER
}

// q rebinds query for the env's dialect.
func (e *env) q(query string) string { return sqlstore.Rebind(e.s.Dialect(), query) }

// count returns the rows of the effects table.
func (e *env) count(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.effects).Scan(&n))
	return n
}

// onEachDB runs body on SQLite and on PostgreSQL (skipped loudly when
// there is no server).
func onEachDB(t *testing.T, body func(t *testing.T, e *env)) {
	t.Run("sqlite", func(t *testing.T) {
		body(t, newEnv(t, openSQLite(t, t.TempDir()), "ferry_"))
	})
	t.Run("postgres", func(t *testing.T) {
		body(t, newEnv(t, openPG(t), prefixFor(t.Name())))
	})
}

func newEnv(t testing.TB, db *sql.DB, prefix string) *env {
	t.Helper()
	ctx := context.Background()
	s, err := sqlstore.Open(ctx, db, sqlstore.WithTablePrefix(prefix))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	e := &env{db: db, s: s, prefix: prefix, effects: prefix + "effects"}
	for _, stmt := range []string{
		"DROP TABLE IF EXISTS " + e.effects,
		"DELETE FROM " + prefix + "cursors",
		"DELETE FROM " + prefix + "finished",
		"CREATE TABLE " + e.effects + " (id TEXT PRIMARY KEY, n INTEGER NOT NULL)",
	} {
		_, err := db.ExecContext(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	return e
}
