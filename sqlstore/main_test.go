package sqlstore_test

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ferrymq/ferry/sqlstore/internal/pgtest"
)

// pg is the PostgreSQL server the tests share, nil when none could be
// started (pgSkip says why).
var (
	pg     *pgtest.Server
	pgSkip string
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashChild())
	}
	var err error
	if pg, err = pgtest.Start(); err != nil {
		pgSkip = "no PostgreSQL server: " + err.Error()
		fmt.Fprintln(os.Stderr, "sqlstore: SKIPPING THE POSTGRESQL TESTS:", pgSkip)
	}
	code := m.Run()
	if pg != nil {
		pg.Stop()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sqliteDSN is the DSN of a SQLite database in file path, as the package
// doc recommends: WAL, a busy timeout and immediate transactions.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate"
}

// openSQLite opens the SQLite database in dir, closed at the end of t.
func openSQLite(t testing.TB, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqliteDSN(filepath.Join(dir, "ferry.db")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// openPG opens the shared PostgreSQL database, closed at the end of t, or
// skips t loudly when there is no server.
func openPG(t testing.TB) *sql.DB {
	t.Helper()
	if pg == nil {
		fmt.Fprintln(os.Stderr, "sqlstore: SKIPPING", t.Name()+":", pgSkip)
		t.Skip(pgSkip)
	}
	db, err := sql.Open("pgx", pg.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// prefixFor is a table prefix of its own for dir: the PostgreSQL tests
// share one database, each directory of the suite gets its own tables.
func prefixFor(dir string) string {
	h := sha256.Sum256([]byte(dir))
	return "t" + hex.EncodeToString(h[:8]) + "_"
}
