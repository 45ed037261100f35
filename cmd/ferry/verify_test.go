package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// TestVerifyLiveStoreNotesOnce: verify of a store whose owner is
// writing to three queues, each active segment with space reserved after
// its frames, finds no damage and says so with one note for all the
// tails, not one per segment; --json lists each.
func TestVerifyLiveStoreNotesOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := filestore.Open(dir)
	require.NoError(t, err)
	defer st.Close()
	meta := ferry.TopicMeta{Name: "t", Queues: 3}
	require.NoError(t, st.SaveTopic(ctx, meta))
	var qs []ferry.Queue
	for i := range meta.Queues {
		q, err := st.OpenQueue(ctx, meta, i)
		require.NoError(t, err)
		_, err = q.Write(ctx, []*ferry.EnhancedMessage{{Message: ferry.Message{Topic: "t", Body: []byte("first")}}})
		require.NoError(t, err)
		qs = append(qs, q)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the owner keeps writing meanwhile
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			_, err := qs[n%3].Write(ctx, []*ferry.EnhancedMessage{{Message: ferry.Message{Topic: "t", Body: fmt.Appendf(nil, "m%d", n)}}})
			if !assert.NoError(t, err) {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()

	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run([]string{"verify", dir}, nil, &out, &errOut), "%s%s", &out, &errOut)
	var notes []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "note:") {
			notes = append(notes, l)
		}
	}
	require.Len(t, notes, 1, out.String())
	assert.Regexp(t, regexp.MustCompile(`^note: 3 newest segments end in bytes after their last frame \(space reserved or a write in progress while the owner runs; torn tails after a crash, which Open cuts\), the first topics/t/0/00000000000000000000\.log at byte [0-9]+ \(--json lists each\)$`), notes[0])
	assert.Contains(t, out.String(), "\nno damage\n")

	out.Reset()
	require.Equal(t, exitOK, run([]string{"verify", "--json", dir}, nil, &out, &errOut), "%s%s", &out, &errOut)
	var rep struct {
		Damaged  bool
		Problems []struct {
			File     string
			Damage   bool
			TornTail bool `json:"torn_tail"`
		}
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	assert.False(t, rep.Damaged)
	require.Len(t, rep.Problems, 3)
	for i, p := range rep.Problems {
		assert.Equal(t, fmt.Sprintf("topics/t/%d/00000000000000000000.log", i), p.File)
		assert.True(t, p.TornTail)
		assert.False(t, p.Damage)
	}
}
