package ferry_test

import (
	"syscall"
	"testing"
	"time"
)

// cost is what a drain took: wall-clock time and the process's CPU time
// (user and system). On a shared machine the CPU time moves less with
// the load of other processes than the wall-clock time does.
type cost struct{ wall, cpu time.Duration }

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure starts a cost measure; its function returns the cost so far.
func measure() func() cost {
	start, cpu0 := time.Now(), cpuTime()
	return func() cost { return cost{time.Since(start), cpuTime() - cpu0} }
}

// pairRatio runs a and b alternately, rounds times each (a first in odd
// rounds, b first in even ones, so that neither always pays the warm-up
// or the other's garbage), and reports each's median wall-clock time per
// round, the ratio of the medians b/a, and the ratio of the median CPU
// times (b/a-cpu) — figures that the load of a shared machine moves far
// less than two separate benchmarks' results.
func pairRatio(tb *testing.B, rounds int, nameA, nameB string, a, b func() cost) {
	var wa, wb, ca, cb []time.Duration
	run := func(f func() cost, w, c *[]time.Duration) {
		r := f()
		*w = append(*w, r.wall)
		*c = append(*c, r.cpu)
	}
	for i := range rounds {
		if i%2 == 0 {
			run(a, &wa, &ca)
			run(b, &wb, &cb)
		} else {
			run(b, &wb, &cb)
			run(a, &wa, &ca)
		}
	}
	ma, mb := medianDur(wa), medianDur(wb)
	tb.ReportMetric(float64(ma.Microseconds()), nameA+"-us")
	tb.ReportMetric(float64(mb.Microseconds()), nameB+"-us")
	tb.ReportMetric(float64(mb)/float64(ma), nameB+"/"+nameA)
	tb.ReportMetric(float64(medianDur(cb))/float64(medianDur(ca)), nameB+"/"+nameA+"-cpu")
}

func medianDur(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
