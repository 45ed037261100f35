package ferry_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Start racing Close (or Broker.Close) must return, nil or ErrClosed:
// Close, a broker's Close included, settles whatever Start waits for.
// Each variant makes raceTries tries, Close coming 0 to 60µs after Start
// began (a sweep), and then waits, bounded by a watchdog, for every Start
// (or first Poll) to return. Start runs under a context that ends only
// after the watchdog, so a Start that hangs is counted, and then released
// instead of leaking.
const (
	raceTries    = 200
	raceWatchdog = 5 * time.Second
)

// spin waits d without sleeping: a sleep's timer slack is longer than the
// race window.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
		runtime.Gosched()
	}
}

// raceResults waits, until one watchdog for all, for every try to report,
// and fails naming the tries that hung or returned an unexpected error.
// ok accepts a try's error. It returns the channels of the tries that hung.
func raceResults(t *testing.T, what string, results []chan error, ok func(error) bool) (pending []chan error) {
	t.Helper()
	deadline := time.After(raceWatchdog)
	var hung, bad []string
	timedOut := false
	for i, ch := range results {
		delay := time.Duration(i%61) * time.Microsecond
		if !timedOut {
			select {
			case err := <-ch:
				if !ok(err) {
					bad = append(bad, fmt.Sprintf("try %d (Close %v after): %v", i, delay, err))
				}
				continue
			case <-deadline:
				timedOut = true
			}
		}
		select {
		case err := <-ch:
			if !ok(err) {
				bad = append(bad, fmt.Sprintf("try %d (Close %v after): %v", i, delay, err))
			}
		default:
			hung = append(hung, fmt.Sprintf("try %d (Close %v after)", i, delay))
			pending = append(pending, ch)
		}
	}
	assert.Empty(t, hung, "watchdog: %s did not return within %v after Close in %d of %d tries", what, raceWatchdog, len(hung), len(results))
	assert.Empty(t, bad, "%s returned something unexpected in %d of %d tries", what, len(bad), len(results))
	return pending
}

// nilOrClosed accepts what Start may return when Close races it.
func nilOrClosed(err error) bool { return err == nil || errors.Is(err, ferry.ErrClosed) }

// release ends the context of the tries that hung and waits for them to
// return, so that they do not leak into the next test.
func release(t *testing.T, cancel context.CancelFunc, pending []chan error) {
	t.Helper()
	cancel()
	deadline := time.After(raceWatchdog)
	for _, ch := range pending {
		select {
		case <-ch:
		case <-deadline:
			t.Errorf("watchdog: %d hung tries did not return even after their context ended", len(pending))
			return
		}
	}
}

func TestStartCloseRacePush(t *testing.T) {
	b := newTopic(t, 4)
	ctx, cancel := context.WithCancel(context.Background()) // ends only after the watchdog
	defer cancel()
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })
	results := make([]chan error, raceTries)
	for i := range raceTries {
		c, err := b.NewConsumer("g", "t", h, ferry.WithMemberID("m"+strconv.Itoa(i)))
		require.NoError(t, err)
		results[i] = make(chan error, 1)
		go func() { results[i] <- c.Start(ctx) }()
		spin(time.Duration(i%61) * time.Microsecond)
		require.NoError(t, c.Close())
	}
	release(t, cancel, raceResults(t, "Consumer.Start", results, nilOrClosed))
}

func TestStartCloseRacePullFirstPoll(t *testing.T) {
	b := newTopic(t, 4)
	ctx, cancel := context.WithCancel(context.Background()) // ends only after the watchdog
	defer cancel()
	results := make([]chan error, raceTries)
	for i := range raceTries {
		pc, err := b.NewPullConsumer("g", "t", ferry.WithMemberID("m"+strconv.Itoa(i)))
		require.NoError(t, err)
		results[i] = make(chan error, 1)
		go func() {
			_, err := pc.Poll(ctx, 1) // starts the consumer, then waits for a message
			results[i] <- err
		}()
		spin(time.Duration(i%61) * time.Microsecond)
		require.NoError(t, pc.Close())
	}
	// Nothing is produced: a Poll can only end with ErrClosed.
	release(t, cancel, raceResults(t, "PullConsumer.Poll (its implicit Start)", results,
		func(err error) bool { return errors.Is(err, ferry.ErrClosed) }))
}

func TestStartBrokerCloseRace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background()) // ends only after the watchdog
	defer cancel()
	h := ferry.HandlerFunc(func(context.Context, *ferry.EnhancedMessage) error { return nil })
	results := make([]chan error, raceTries)
	for i := range raceTries {
		b, err := ferry.NewBroker()
		require.NoError(t, err)
		require.NoError(t, b.CreateTopic(context.Background(), ferry.TopicMeta{Name: "t", Queues: 4}))
		c, err := b.NewConsumer("g", "t", h)
		require.NoError(t, err)
		results[i] = make(chan error, 1)
		go func() { results[i] <- c.Start(ctx) }()
		spin(time.Duration(i%61) * time.Microsecond)
		require.NoError(t, b.Close())
		require.NoError(t, c.Close())
	}
	release(t, cancel, raceResults(t, "Consumer.Start racing Broker.Close", results, nilOrClosed))
}
