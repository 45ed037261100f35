// Ledger moves money between accounts kept in SQLite, one transfer per
// message, each applied exactly once: the handler writes the debit and the
// credit in the transaction sqlstore gives it (sqlstore.TxFrom), and the
// consumer commits the message's cursor in that same transaction. A
// transfer whose first attempt fails after its debit is rolled back whole
// and retried; a second run of the consumer over the same files applies
// nothing again.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
	"github.com/ferrymq/ferry/sqlstore"
)

const (
	topic = "transfers"
	group = "ledger"
)

var transfers = []string{"alice bob 30", "bob carol 20", "carol alice 5", "alice carol 40", "bob alice 10"}

func main() {
	dir, err := os.MkdirTemp("", "ferry-ledger-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := run(context.Background(), os.Stdout, dir); err != nil {
		log.Fatal(err)
	}
}

// run sends the transfers, consumes them twice (the second run finds
// nothing to do) and prints what was applied and the balances.
func run(ctx context.Context, w io.Writer, dir string) error {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "ledger.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		return err
	}
	defer db.Close()
	for _, stmt := range []string{
		"CREATE TABLE accounts (name TEXT PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0))",
		"INSERT INTO accounts VALUES ('alice', 100), ('bob', 50), ('carol', 0)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	if err := send(ctx, filepath.Join(dir, "messages")); err != nil {
		return err
	}
	for i := range 2 {
		n, err := consume(ctx, w, db, filepath.Join(dir, "messages"))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "run %d applied %d transfers\n", i+1, n)
	}
	rows, err := db.QueryContext(ctx, "SELECT name, balance FROM accounts ORDER BY name")
	if err != nil {
		return err
	}
	defer rows.Close()
	total := 0
	for rows.Next() {
		var name string
		var balance int
		if err := rows.Scan(&name, &balance); err != nil {
			return err
		}
		total += balance
		fmt.Fprintf(w, "%s: %d\n", name, balance)
	}
	fmt.Fprintf(w, "total: %d\n", total)
	return rows.Err()
}

// send writes the transfers to a topic of one queue in a filestore.
func send(ctx context.Context, dir string) error {
	st, err := filestore.Open(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	b, err := ferry.NewBroker(ferry.WithStorage(st))
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.CreateTopic(ctx, ferry.TopicMeta{Name: topic, Queues: 1}); err != nil {
		return err
	}
	p, err := b.NewProducer()
	if err != nil {
		return err
	}
	defer p.Close()
	for _, t := range transfers {
		if _, err := p.Send(ctx, &ferry.Message{Topic: topic, Body: []byte(t)}); err != nil {
			return err
		}
	}
	return nil
}

// consume runs a consumer of the transfers until every one is applied and
// returns how many it applied.
func consume(ctx context.Context, w io.Writer, db *sql.DB, dir string) (int, error) {
	st, err := filestore.Open(dir)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	// One process, with the broker's in-process coordinator: its lease
	// tokens start again with it (see sqlstore.WithResetTokens).
	cursors, err := sqlstore.Open(ctx, db, sqlstore.WithResetTokens())
	if err != nil {
		return 0, err
	}
	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(cursors))
	if err != nil {
		return 0, err
	}
	defer b.Close()
	var mu sync.Mutex
	applied := 0
	failedOnce := false
	h := ferry.HandlerFunc(func(ctx context.Context, m *ferry.EnhancedMessage) error {
		tx, ok := sqlstore.TxFrom(ctx)
		if !ok {
			return ferry.Permanent(errors.New("no transaction"))
		}
		f := strings.Fields(string(m.Body))
		from, to := f[0], f[1]
		amount, err := strconv.Atoi(f[2])
		if err != nil {
			return ferry.Permanent(err)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - ? WHERE name = ?", amount, from); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if m.Offset == 3 && !failedOnce {
			failedOnce = true
			fmt.Fprintf(w, "offset %d: %s -> %s %d failed after the debit: rolled back, retried\n", m.Offset, from, to, amount)
			return errors.New("the credit service is down")
		}
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + ? WHERE name = ?", amount, to); err != nil {
			return err
		}
		applied++
		fmt.Fprintf(w, "offset %d: %s -> %s %d\n", m.Offset, from, to, amount)
		return nil
	})
	c, err := b.NewConsumer(group, topic, h, ferry.Ordered(), ferry.WithRetry(3, time.Millisecond))
	if err != nil {
		return 0, err
	}
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	defer c.Close()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	// Wait until the cursor, which the handlers' transactions advance, is
	// at the end of the queue.
	for {
		offs, err := cursors.Load(ctx, topic, group, 1)
		if err != nil {
			return 0, err
		}
		if offs[0] == int64(len(transfers)) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
	if err := c.Close(); err != nil {
		return 0, err
	}
	mu.Lock()
	defer mu.Unlock()
	return applied, nil
}
