package ferry

import "time"

// Clock is the time that delayed delivery and retries run on: when a
// delayed message is due, when a retry is. The default is the system
// clock; a test sets a fake one with [WithClock] (ferrytest has one) to
// run delays of hours in milliseconds. Message timestamps (BornTime,
// StoreTime) and the consumers' internal timers (commit interval, drain
// timeout, leases) always run on the system clock.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed, unless
	// the returned timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending call of [Clock.AfterFunc].
type Timer interface {
	// Stop prevents the call, and reports whether it did (false: the
	// call has run or started, or the timer was stopped already).
	Stop() bool
}

// clockSlack is how far a Clock may move between a reading of it and a
// timer set from that reading (AfterFunc of the wait it computed) before
// the timer is set again: a timer set later than its reading fires that
// much late, and a fake clock that a test moves on another goroutine may
// jump past the due time meanwhile and then never far enough.
const clockSlack = time.Millisecond

// WithClock sets the clock of delayed delivery and retries (see [Clock]).
// Default: the system clock.
func WithClock(c Clock) BrokerOption { return func(cfg *brokerConfig) { cfg.clock = c } }

// systemClock is the default Clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
