package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferry"
)

// queueStat is what the topic commands show of a queue.
type queueStat struct {
	Queue      int        `json:"queue"`
	Oldest     int64      `json:"oldest"`
	Next       int64      `json:"next"`
	Messages   int64      `json:"messages"`
	Segments   int        `json:"segments"`
	Bytes      int64      `json:"bytes"` // on disk: segments and indexes
	Tail       int64      `json:"tail_bytes,omitempty"`
	FirstTime  *time.Time `json:"first_time,omitempty"`
	LastTime   *time.Time `json:"last_time,omitempty"`
	firstStamp time.Time
	lastStamp  time.Time
}

// statQueue reads queue i of meta: its offsets, and its files when the
// store has files.
func statQueue(ctx context.Context, st readStore, meta ferry.TopicMeta, i int, noTimes bool) (queueStat, error) {
	q, err := st.OpenQueue(ctx, meta, i)
	if err != nil {
		return queueStat{}, err
	}
	defer q.Close()
	qs := queueStat{Queue: i}
	if sl, ok := st.(segmentLister); ok {
		segs, err := sl.Segments(ctx, meta.Name, i)
		if err != nil {
			return queueStat{}, err
		}
		if err := segmentDamage(q.ID(), segs); err != nil {
			return queueStat{}, err
		}
		for j, s := range segs {
			qs.Segments++
			qs.Bytes += s.Bytes + s.IndexBytes
			if j == len(segs)-1 {
				qs.Tail = s.Bytes - s.Frames
			}
			if qs.firstStamp.IsZero() {
				qs.firstStamp = s.FirstTime
			}
			if !s.LastTime.IsZero() {
				qs.lastStamp = s.LastTime
			}
		}
	}
	qs.Oldest, qs.Next = q.Offsets()
	qs.Messages = qs.Next - qs.Oldest
	if !noTimes {
		if !qs.firstStamp.IsZero() {
			t := qs.firstStamp.UTC()
			qs.FirstTime = &t
		}
		if !qs.lastStamp.IsZero() {
			t := qs.lastStamp.UTC()
			qs.LastTime = &t
		}
	}
	return qs, nil
}

type topicJSON struct {
	Name      string        `json:"name"`
	Queues    int           `json:"queues"`
	Messages  int64         `json:"messages"`
	Bytes     int64         `json:"bytes"`
	Segments  int           `json:"segments"`
	Retention retentionJSON `json:"retention"`
	PerQueue  []queueStat   `json:"per_queue,omitempty"`
}

func statTopic(ctx context.Context, st readStore, meta ferry.TopicMeta, noTimes bool) (topicJSON, error) {
	tj := topicJSON{Name: meta.Name, Queues: meta.Queues, Retention: retentionOf(meta.Retention)}
	for i := range meta.Queues {
		qs, err := statQueue(ctx, st, meta, i, noTimes)
		if err != nil {
			return tj, err
		}
		tj.Messages += qs.Messages
		tj.Bytes += qs.Bytes
		tj.Segments += qs.Segments
		tj.PerQueue = append(tj.PerQueue, qs)
	}
	return tj, nil
}

func (a *app) topicsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "topics",
		Short: "List the topics: queues, messages, size on disk",
		Example: `  ferry --store ./data topics
  ferry --store ./data topics --json`,
		Args: nArgs(0, 0),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := ctxOf(c)
			st, err := a.openRead()
			if err != nil {
				return err
			}
			defer st.Close()
			metas, err := st.Topics(ctx)
			if err != nil {
				return err
			}
			out := []topicJSON{}
			for _, m := range metas {
				tj, err := statTopic(ctx, st, m, a.noTimes)
				if err != nil {
					return err
				}
				tj.PerQueue = nil
				out = append(out, tj)
			}
			if a.json {
				return writeJSON(a.stdout, out)
			}
			t := newTable(a.stdout, "TOPIC", "QUEUES", "MESSAGES", "SIZE", "SEGMENTS", "RETENTION")
			for _, tj := range out {
				t.row(tj.Name, strconv.Itoa(tj.Queues), strconv.FormatInt(tj.Messages, 10), humanBytes(tj.Bytes), strconv.Itoa(tj.Segments), retentionString(retentionFrom(metas, tj.Name)))
			}
			return t.flush()
		},
	}
}

func retentionFrom(metas []ferry.TopicMeta, name string) ferry.Retention {
	for _, m := range metas {
		if m.Name == name {
			return m.Retention
		}
	}
	return ferry.Retention{}
}

func (a *app) topicCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "topic NAME",
		Short: "Show a topic: retention, and per queue the offsets, segments and size",
		Example: `  ferry --store ./data topic orders
  ferry --store ./data topic orders --json`,
		Args: nArgs(1, 1),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := ctxOf(c)
			st, err := a.openRead()
			if err != nil {
				return err
			}
			defer st.Close()
			meta, err := topicMeta(ctx, st, args[0])
			if err != nil {
				return err
			}
			tj, err := statTopic(ctx, st, meta, a.noTimes)
			if err != nil {
				return err
			}
			if a.json {
				return writeJSON(a.stdout, tj)
			}
			fmt.Fprintf(a.stdout, "topic:     %s\nqueues:    %d\nretention: %s\nmessages:  %d\nsize:      %s in %d segments\n\n",
				meta.Name, meta.Queues, retentionString(meta.Retention), tj.Messages, humanBytes(tj.Bytes), tj.Segments)
			cols := []string{"QUEUE", "OLDEST", "NEXT", "MESSAGES", "SEGMENTS", "SIZE"}
			if !a.noTimes {
				cols = append(cols, "OLDEST MESSAGE", "NEWEST MESSAGE")
			}
			t := newTable(a.stdout, cols...)
			now := a.now()
			for _, qs := range tj.PerQueue {
				row := []string{strconv.Itoa(qs.Queue), strconv.FormatInt(qs.Oldest, 10), strconv.FormatInt(qs.Next, 10),
					strconv.FormatInt(qs.Messages, 10), strconv.Itoa(qs.Segments), humanBytes(qs.Bytes)}
				if !a.noTimes {
					row = append(row, ago(now, qs.firstStamp), ago(now, qs.lastStamp))
				}
				t.row(row...)
			}
			return t.flush()
		},
	}
}
