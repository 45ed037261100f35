package ferry

import (
	"errors"
	"math"
	"sync"
	"time"
)

// WithRateLimit limits the consumer's handler calls to perSecond, with
// bursts of up to burst calls (push consumers only): a token bucket
// shared by every queue the member holds, each call taking a token and
// waiting for one when there is none (retries included). While calls
// wait, fetching stops at the queues' [Buffer] bounds, as for a slow
// handler, so throttling never prefetches without bound. A wait ends at
// once when the queue is released or the consumer closes: the message
// goes back unfinished, for the next owner (or this one once it takes
// the queue again), uncounted as an attempt. The limit is per consumer,
// not per group: n members of a group handle up to n × perSecond. A
// perSecond or burst below 1 (or not a number, or infinite) is
// [ErrInvalidOption]. Default: no limit.
//
// The bucket is written here rather than taken from golang.org/x/time/rate
// so that the core module keeps to its dependencies; it is a dozen lines.
func WithRateLimit(perSecond float64, burst int) ConsumerOption {
	return pushOption(func(c *consumerConfig) { c.rate, c.burst, c.limited = perSecond, burst, true })
}

// validRate checks WithRateLimit's arguments.
func validRate(perSecond float64, burst int) bool {
	return perSecond >= 1 && !math.IsInf(perSecond, 0) && !math.IsNaN(perSecond) && burst >= 1
}

// limiter is a token bucket: tokens grow at rate per second up to burst;
// a call takes one, waiting (the bucket going below zero) when there is
// none.
type limiter struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newLimiter(rate float64, burst int) *limiter {
	return &limiter{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// reserve takes a token and returns how long to wait before using it.
func (l *limiter) reserve(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.After(l.last) {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
		l.last = now
	}
	l.tokens--
	if l.tokens >= 0 {
		return 0
	}
	return time.Duration(-l.tokens / l.rate * float64(time.Second))
}

// unreserve gives back a token reserved and not used.
func (l *limiter) unreserve() {
	l.mu.Lock()
	l.tokens = min(l.burst, l.tokens+1)
	l.mu.Unlock()
}

// errGivenUp is call's error when the queue was given up while the call
// waited for the rate limit: the message goes back unfinished, no
// attempt made.
var errGivenUp = errors.New("queue given up while waiting for the rate limit")

// throttle waits for the rate limit's token before a call on r, or
// reports (false) that r was given up meanwhile.
func (d *deliverer) throttle(r *queueRun) bool {
	if d.lim == nil {
		return true
	}
	w := d.lim.reserve(time.Now())
	if w <= 0 {
		return true
	}
	if !d.wait(r, w) {
		d.lim.unreserve()
		return false
	}
	return true
}
