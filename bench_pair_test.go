package ferry_test

import (
	"testing"
	"time"
)

// pairRatio runs a and b alternately, rounds times each (a first in odd
// rounds, b first in even ones, so that neither always pays the warm-up
// or the other's garbage), and reports each's median time per round and
// the ratio of the medians b/a — a figure that the load of a shared
// machine moves far less than two separate benchmarks' results.
func pairRatio(tb *testing.B, rounds int, nameA, nameB string, a, b func() time.Duration) {
	var ta, tb2 []time.Duration
	for i := range rounds {
		if i%2 == 0 {
			ta = append(ta, a())
			tb2 = append(tb2, b())
		} else {
			tb2 = append(tb2, b())
			ta = append(ta, a())
		}
	}
	ma, mb := medianDur(ta), medianDur(tb2)
	tb.ReportMetric(float64(ma.Microseconds()), nameA+"-us")
	tb.ReportMetric(float64(mb.Microseconds()), nameB+"-us")
	tb.ReportMetric(float64(mb)/float64(ma), nameB+"/"+nameA)
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
