package ferry

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func topicNamed(name string) *topicState { return &topicState{meta: TopicMeta{Name: name}} }

// The table agrees with a map through random stores, replacements and
// removals, across growths and tombstone rebuilds.
func TestTopicTableMatchesMap(t *testing.T) {
	tt := newTopicTable()
	model := map[string]*topicState{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		name := "t" + strconv.Itoa(r.IntN(3000))
		switch r.IntN(3) {
		case 0, 1:
			s := topicNamed(name)
			tt.store(s)
			model[name] = s
		case 2:
			tt.remove(name)
			delete(model, name)
		}
		if i%1000 == 0 {
			for n, want := range model {
				got, ok := tt.lookup(n)
				require.True(t, ok, n)
				require.Same(t, want, got, n)
			}
			seen := 0
			tt.each(func(s *topicState) {
				require.Same(t, model[s.meta.Name], s)
				seen++
			})
			require.Equal(t, len(model), seen)
			require.Equal(t, len(model), tt.live)
		}
	}
	for i := range 3000 {
		name := "t" + strconv.Itoa(i)
		got, ok := tt.lookup(name)
		want, had := model[name]
		require.Equal(t, had, ok, name)
		if had {
			require.Same(t, want, got)
		}
	}
	_, ok := tt.lookup("absent")
	require.False(t, ok)
}

// Lookups run with no lock while a writer adds and removes topics: a
// topic stored before the readers start is always found (run with -race).
func TestTopicTableConcurrentLookups(t *testing.T) {
	tt := newTopicTable()
	stable := make([]*topicState, 100)
	for i := range stable {
		stable[i] = topicNamed("stable-" + strconv.Itoa(i))
		tt.store(stable[i])
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				want := stable[i%len(stable)]
				got, ok := tt.lookup(want.meta.Name)
				if !ok || got != want {
					t.Errorf("lookup %s: %v, %v", want.meta.Name, got, ok)
					return
				}
				tt.lookup("churn-" + strconv.Itoa(i%5000))
			}
		})
	}
	for i := range 20000 {
		name := "churn-" + strconv.Itoa(i%5000)
		if i%3 == 2 {
			tt.remove(name)
		} else {
			tt.store(topicNamed(name))
		}
	}
	stop.Store(true)
	wg.Wait()
}
