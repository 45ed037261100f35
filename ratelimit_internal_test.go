package ferry

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestLimiterPrecision: over 10 s of simulated time, callers that arrive
// at random and wait as told get the rate within 5%: never more than
// rate × 10 s + burst calls, and, when they keep asking, at least 95%
// of rate × 10 s; every window of a second holds at most rate + burst.
func TestLimiterPrecision(t *testing.T) {
	const rate, burst = 200.0, 5
	t0 := time.Unix(1_000_000, 0)
	for _, load := range []string{"saturated", "sparse"} {
		l := &limiter{rate: rate, burst: burst, tokens: burst, last: t0}
		rng := rand.New(rand.NewPCG(1, 2))
		var calls []time.Time
		now := t0
		for now.Before(t0.Add(10 * time.Second)) {
			gap := time.Duration(rng.Int64N(int64(time.Millisecond)))
			if load == "sparse" {
				gap = time.Duration(rng.Int64N(int64(20 * time.Millisecond)))
			}
			now = now.Add(gap)
			at := now.Add(l.reserve(now)) // the call runs when told
			calls = append(calls, at)
		}
		end := t0.Add(10 * time.Second)
		n := 0
		for _, c := range calls {
			if c.Before(end) {
				n++
			}
		}
		assert.LessOrEqual(t, float64(n), rate*10+burst, load)
		if load == "saturated" {
			assert.GreaterOrEqual(t, float64(n), 0.95*rate*10, load)
		}
		for i := range calls {
			j := i
			for j < len(calls) && calls[j].Sub(calls[i]) < time.Second {
				j++
			}
			if j-i > rate+burst {
				t.Fatalf("%s: %d calls within a second from call %d", load, j-i, i)
			}
		}
	}
}
