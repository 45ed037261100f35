package sqlstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkCommit compares, on SQLite and on PostgreSQL, one handler
// transaction through the store (Begin, one effect row written in the
// transaction from TxFrom, Commit with the cursor) with the database's
// own transaction of the same effect row alone (db: BEGIN, INSERT,
// COMMIT). The consumer's batched CommitFenced, which trims the finished
// rows, runs every 100 operations outside the timing.
func BenchmarkCommit(b *testing.B) {
	for _, dbName := range []string{"sqlite", "postgres"} {
		for _, mode := range []string{"db", "sqlstore"} {
			b.Run(dbName+"/"+mode, func(b *testing.B) {
				var e *env
				if dbName == "sqlite" {
					e = newEnv(b, openSQLite(b, b.TempDir()), "ferry_")
				} else {
					e = newEnv(b, openPG(b), prefixFor(b.Name()))
				}
				ctx := context.Background()
				insert := e.q("INSERT INTO " + e.effects + " (id, n) VALUES (?, ?)")
				require.NoError(b, e.s.CommitFenced(ctx, "orders", "billing", 0, 0, 1))
				b.ResetTimer()
				for i := range b.N {
					id := strconv.Itoa(i)
					if mode == "db" {
						tx, err := e.db.BeginTx(ctx, nil)
						require.NoError(b, err)
						_, err = tx.ExecContext(ctx, insert, id, i)
						require.NoError(b, err)
						require.NoError(b, tx.Commit())
						continue
					}
					err := apply(ctx, e, "orders", "billing", 0, int64(i), 1)
					require.NoError(b, err)
					if i%100 == 99 {
						b.StopTimer()
						require.NoError(b, e.s.CommitFenced(ctx, "orders", "billing", 0, int64(i+1), 1))
						b.StartTimer()
					}
				}
			})
		}
	}
}

// BenchmarkCommitPaired is BenchmarkCommit with the two kinds of
// transaction alternating in one loop, so that both see the same machine
// and disk: it reports each one's mean latency (db-ns/tx, sqlstore-ns/tx)
// and their ratio (sqlstore/db), the figure the store aims to keep at or
// under 1.2.
func BenchmarkCommitPaired(b *testing.B) {
	for _, dbName := range []string{"sqlite", "postgres"} {
		b.Run(dbName, func(b *testing.B) {
			var e *env
			if dbName == "sqlite" {
				e = newEnv(b, openSQLite(b, b.TempDir()), "ferry_")
			} else {
				e = newEnv(b, openPG(b), prefixFor(b.Name()))
			}
			ctx := context.Background()
			insert := e.q("INSERT INTO " + e.effects + " (id, n) VALUES (?, ?)")
			require.NoError(b, e.s.CommitFenced(ctx, "orders", "billing", 0, 0, 1))
			var dbTime, storeTime time.Duration
			b.ResetTimer()
			for i := range b.N {
				began := time.Now()
				tx, err := e.db.BeginTx(ctx, nil)
				require.NoError(b, err)
				_, err = tx.ExecContext(ctx, insert, "db-"+strconv.Itoa(i), i)
				require.NoError(b, err)
				require.NoError(b, tx.Commit())
				mid := time.Now()
				require.NoError(b, apply(ctx, e, "orders", "billing", 0, int64(i), 1))
				storeTime += time.Since(mid)
				dbTime += mid.Sub(began)
				if i%100 == 99 {
					b.StopTimer()
					require.NoError(b, e.s.CommitFenced(ctx, "orders", "billing", 0, int64(i+1), 1))
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(dbTime.Nanoseconds())/float64(b.N), "db-ns/tx")
			b.ReportMetric(float64(storeTime.Nanoseconds())/float64(b.N), "sqlstore-ns/tx")
			b.ReportMetric(float64(storeTime)/float64(dbTime), "sqlstore/db")
		})
	}
}
