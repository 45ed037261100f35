package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
	"github.com/ferrymq/ferry/internal/crashtest"
	"github.com/ferrymq/ferry/sqlstore"
)

// The crash test re-executes the test binary as a child (TestMain runs
// crashChild instead of the tests) that consumes a filestore topic of
// crashMessages messages over 3 queues with a Store for its cursors: the
// handler (OrderedByKey, 4 at a time, one attempt in 8 failing) inserts
// an effect row (queue, offset) in the transaction from TxFrom and prints
// "h <queue> <offset>" before it returns, so that the cursor commit is
// under way when the parent reads the line. The parent SIGKILLs it after a
// random number of lines, and checks after every kill: no message has two
// effect rows, and per queue the finished offsets the store gives (below
// the folded cursor, and the finished rows above it) are exactly those
// with an effect row: the cursor is neither ahead of the effects nor
// behind them. Rounds go on until a child has consumed everything (it
// prints "done" and exits); then every message has its effect row once.
// FERRY_SQLSTORE_CRASH_ROUNDS bounds the killed rounds (default 12).

const (
	crashChildEnv  = "FERRY_SQLSTORE_CRASH_CHILD" // dialect|dsn|dir|prefix
	crashRoundsEnv = "FERRY_SQLSTORE_CRASH_ROUNDS"
	crashMessages  = 400
	crashQueues    = 3
	crashTopic     = "crash"
	crashGroup     = "g"
)

type crashSpec struct {
	dialect, dsn, dir, prefix string
}

func (c crashSpec) String() string {
	return strings.Join([]string{c.dialect, c.dsn, c.dir, c.prefix}, "|")
}

func parseCrashSpec(s string) crashSpec {
	f := strings.SplitN(s, "|", 4)
	return crashSpec{f[0], f[1], f[2], f[3]}
}

func (c crashSpec) open() (*sql.DB, error) {
	driver := "sqlite"
	if c.dialect == "postgres" {
		driver = "pgx"
	}
	return sql.Open(driver, c.dsn)
}

// crashChild is the child's work; its result is the exit code.
func crashChild() int {
	spec := parseCrashSpec(os.Getenv(crashChildEnv))
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ctx := context.Background()
	db, err := spec.open()
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	// One process at a time, with the broker's in-process coordinator,
	// whose tokens start again with it.
	cs, err := sqlstore.Open(ctx, db, sqlstore.WithTablePrefix(spec.prefix), sqlstore.WithResetTokens())
	if err != nil {
		return fail(err)
	}
	st, err := filestore.Open(spec.dir)
	if err != nil {
		return fail(err)
	}
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(cs))
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	defer b.Close()
	insert := sqlstore.Rebind(cs.Dialect(), "INSERT INTO "+spec.prefix+"effects (queue_no, msg_offset) VALUES (?, ?)")
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		tx, ok := sqlstore.TxFrom(ctx)
		if !ok {
			return ferry.Permanent(fmt.Errorf("no transaction"))
		}
		if _, err := tx.ExecContext(ctx, insert, m.Queue, m.Offset); err != nil {
			return err
		}
		if rand.IntN(8) == 0 {
			return fmt.Errorf("this attempt fails")
		}
		fmt.Printf("h %d %d\n", m.Queue, m.Offset)
		return nil
	})
	c, err := b.NewConsumer(crashGroup, crashTopic, h, ferry.OrderedByKey(), ferry.WithConcurrency(4), ferry.WithRetry(1000, time.Millisecond))
	if err != nil {
		return fail(err)
	}
	if err := c.Start(ctx); err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		offs, err := cs.Load(ctx, crashTopic, crashGroup, crashQueues)
		if err != nil {
			return fail(err)
		}
		var sum int64
		for _, o := range offs {
			sum += max(o, 0)
		}
		if sum == crashMessages {
			break
		}
	}
	if err := c.Close(); err != nil {
		return fail(err)
	}
	fmt.Println("done")
	return 0
}

func TestCrashSQLite(t *testing.T) {
	dir := t.TempDir()
	crashTest(t, crashSpec{dialect: "sqlite", dsn: sqliteDSN(filepath.Join(dir, "ferry.db")), dir: filepath.Join(dir, "store"), prefix: "ferry_"})
}

func TestCrashPostgres(t *testing.T) {
	openPG(t) // skips without a server
	crashTest(t, crashSpec{dialect: "postgres", dsn: pg.DSN, dir: filepath.Join(t.TempDir(), "store"), prefix: prefixFor(t.Name())})
}

func crashTest(t *testing.T, spec crashSpec) {
	rounds := 12
	if s := os.Getenv(crashRoundsEnv); s != "" {
		var err error
		rounds, err = strconv.Atoi(s)
		require.NoError(t, err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 29))
	ctx := context.Background()

	// The messages, in a filestore the children consume.
	st, err := filestore.Open(spec.dir)
	require.NoError(t, err)
	b, err := ferry.NewBroker(ferry.WithStorage(st))
	require.NoError(t, err)
	require.NoError(t, b.CreateTopic(ctx, ferry.TopicMeta{Name: crashTopic, Queues: crashQueues}))
	p, err := b.NewProducer()
	require.NoError(t, err)
	ends := make([]int64, crashQueues)
	for i := range crashMessages {
		r, err := p.Send(ctx, &ferry.Message{Topic: crashTopic, Key: strconv.Itoa(rng.IntN(40)), Body: []byte(strconv.Itoa(i))})
		require.NoError(t, err)
		ends[r.Queue.Queue] = r.Offset + 1
	}
	require.NoError(t, p.Close())
	require.NoError(t, b.Close())
	require.NoError(t, st.Close())

	db, err := spec.open()
	require.NoError(t, err)
	defer db.Close()
	cs, err := sqlstore.Open(ctx, db, sqlstore.WithTablePrefix(spec.prefix))
	require.NoError(t, err)
	defer cs.Close()
	for _, stmt := range []string{
		"DROP TABLE IF EXISTS " + spec.prefix + "effects",
		"DELETE FROM " + spec.prefix + "cursors",
		"DELETE FROM " + spec.prefix + "finished",
		"CREATE TABLE " + spec.prefix + "effects (queue_no INTEGER NOT NULL, msg_offset BIGINT NOT NULL)",
	} {
		_, err := db.ExecContext(ctx, stmt)
		require.NoError(t, err, stmt)
	}

	env := []string{crashChildEnv + "=" + spec.String()}
	for round := 0; ; round++ {
		after := 2 + rng.IntN(60)
		if round >= rounds {
			after = 1 << 30 // run to the end
		}
		lines, stderr, _, err := crashtest.Run(env, after)
		require.NoError(t, err)
		require.NotContains(t, stderr, "DATA RACE", "the child")
		require.NotContains(t, stderr, "child:", "the child failed")
		checkCrashRecovery(t, db, cs, spec.prefix)
		if slices.Contains(lines, "done") {
			t.Logf("done in round %d", round)
			break
		}
		require.Less(t, round, rounds+1, "the last child stopped before it was done: %s", stderr)
	}
	// Everything consumed: every message's effect once.
	var n, distinct int
	require.NoError(t, db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT queue_no * 1000000 + msg_offset) FROM "+spec.prefix+"effects").Scan(&n, &distinct))
	require.Equal(t, crashMessages, n)
	require.Equal(t, crashMessages, distinct)
	offs, err := cs.Load(ctx, crashTopic, crashGroup, crashQueues)
	require.NoError(t, err)
	require.Equal(t, ends, offs)
}

// checkCrashRecovery checks the state a killed child left: each effect at
// most once, and per queue the offsets the store counts finished are
// exactly those with an effect. It reads in one snapshot: the server may
// still be committing a transaction of the killed child's.
func checkCrashRecovery(t *testing.T, db *sql.DB, cs *sqlstore.Store, prefix string) {
	t.Helper()
	ctx := context.Background()
	var opts *sql.TxOptions
	if cs.Dialect() == sqlstore.Postgres {
		opts = &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	}
	tx, err := db.BeginTx(ctx, opts)
	require.NoError(t, err)
	defer tx.Rollback()
	effects := make([]map[int64]int, crashQueues)
	finished := make([]map[int64]bool, crashQueues)
	cursor := make([]int64, crashQueues)
	for q := range effects {
		effects[q], finished[q], cursor[q] = map[int64]int{}, map[int64]bool{}, -1
	}
	scan := func(query string, row func(q int, off int64)) {
		t.Helper()
		rows, err := tx.QueryContext(ctx, query)
		require.NoError(t, err, query)
		defer rows.Close()
		for rows.Next() {
			var q int
			var off int64
			require.NoError(t, rows.Scan(&q, &off))
			row(q, off)
		}
		require.NoError(t, rows.Err())
	}
	scan("SELECT queue_no, msg_offset FROM "+prefix+"effects", func(q int, off int64) {
		effects[q][off]++
		require.Equal(t, 1, effects[q][off], "queue %d offset %d: effect applied twice", q, off)
	})
	scan("SELECT queue_no, next_offset FROM "+prefix+"cursors", func(q int, off int64) { cursor[q] = off })
	scan("SELECT queue_no, msg_offset FROM "+prefix+"finished", func(q int, off int64) { finished[q][off] = true })
	for q := range crashQueues {
		for o := range cursor[q] {
			finished[q][o] = true // below the committed cursor
		}
		for o := range finished[q] {
			require.Equal(t, 1, effects[q][o], "queue %d: offset %d counted finished (cursor %d) without its effect", q, o, cursor[q])
		}
		for o := range effects[q] {
			require.True(t, finished[q][o], "queue %d: offset %d has its effect but is not finished (cursor %d): it would be applied again", q, o, cursor[q])
		}
	}
	require.NoError(t, tx.Commit())
	// The store's own view agrees: its folded cursors count finished
	// only offsets with effects.
	offs, err := cs.Load(ctx, crashTopic, crashGroup, crashQueues)
	require.NoError(t, err)
	for q, off := range offs {
		require.GreaterOrEqual(t, off, cursor[q], "queue %d: Load below the committed cursor", q)
	}
}
