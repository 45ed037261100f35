package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferry"
)

// queueLag is one queue's lag for a group.
type queueLag struct {
	Queue     int   `json:"queue"`
	Committed int64 `json:"committed"` // -1: nothing committed
	Oldest    int64 `json:"oldest"`
	Next      int64 `json:"next"`
	Lag       int64 `json:"lag"`
	// Behind: the committed offset is below the oldest retained one, so
	// messages were dropped before the group read them.
	Behind bool `json:"behind,omitempty"`
}

type groupLag struct {
	Topic  string     `json:"topic"`
	Group  string     `json:"group"`
	Queues []queueLag `json:"queues"`
	Lag    int64      `json:"lag"`
}

// lagOf computes the lag of a group's committed offsets: per queue,
// next - max(committed, oldest), and next - oldest where nothing is
// committed (the whole retained queue; where the group starts then
// depends on its consumers' StartFrom).
func lagOf(topic, group string, committed []int64, offsets [][2]int64) groupLag {
	g := groupLag{Topic: topic, Group: group, Queues: []queueLag{}}
	for i, off := range offsets {
		ql := queueLag{Queue: i, Committed: committed[i], Oldest: off[0], Next: off[1]}
		from := max(ql.Committed, ql.Oldest)
		ql.Behind = ql.Committed >= 0 && ql.Committed < ql.Oldest
		ql.Lag = max(ql.Next-from, 0)
		g.Queues = append(g.Queues, ql)
		g.Lag += ql.Lag
	}
	return g
}

// queueOffsets returns each queue's oldest and next offsets, or the
// damage of a queue (see queueDamage), whose next offset would be the
// damage's.
func queueOffsets(ctx context.Context, st readStore, meta ferry.TopicMeta) ([][2]int64, error) {
	for i := range meta.Queues {
		if err := queueDamage(ctx, st, meta, i); err != nil {
			return nil, err
		}
	}
	return offsetsOf(ctx, st, meta)
}

// offsetsOf returns each queue's oldest and next offsets as its Offsets
// says.
func offsetsOf(ctx context.Context, st ferry.Storage, meta ferry.TopicMeta) ([][2]int64, error) {
	out := make([][2]int64, meta.Queues)
	for i := range out {
		q, err := st.OpenQueue(ctx, meta, i)
		if err != nil {
			return nil, err
		}
		o, n := q.Offsets()
		_ = q.Close()
		out[i] = [2]int64{o, n}
	}
	return out, nil
}

func offStr(o int64) string {
	if o < 0 {
		return "-"
	}
	return strconv.FormatInt(o, 10)
}

func (a *app) groupsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "groups [TOPIC]",
		Short: "List the consumer groups with committed cursors, and their total lag",
		Example: `  ferry --store ./data groups
  ferry --store ./data groups orders --json`,
		Args: nArgs(0, 1),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := ctxOf(c)
			st, err := a.openRead()
			if err != nil {
				return err
			}
			defer st.Close()
			var metas []ferry.TopicMeta
			if len(args) == 1 {
				m, err := topicMeta(ctx, st, args[0])
				if err != nil {
					return err
				}
				metas = []ferry.TopicMeta{m}
			} else if metas, err = st.Topics(ctx); err != nil {
				return err
			}
			type groupJSON struct {
				Topic     string `json:"topic"`
				Group     string `json:"group"`
				Queues    int    `json:"queues"`
				Committed int    `json:"committed_queues"`
				Lag       int64  `json:"lag"`
			}
			out := []groupJSON{}
			for _, meta := range metas {
				cur, err := st.Cursors(ctx, meta.Name, meta.Queues)
				if err != nil {
					return err
				}
				if len(cur.Groups) == 0 {
					continue
				}
				offs, err := queueOffsets(ctx, st, meta)
				if err != nil {
					return err
				}
				names := make([]string, 0, len(cur.Groups))
				for g := range cur.Groups {
					names = append(names, g)
				}
				slices.Sort(names)
				for _, g := range names {
					offsets := cur.Groups[g].Offsets
					l := lagOf(meta.Name, g, offsets, offs)
					n := 0
					for _, o := range offsets {
						if o >= 0 {
							n++
						}
					}
					out = append(out, groupJSON{Topic: meta.Name, Group: g, Queues: meta.Queues, Committed: n, Lag: l.Lag})
				}
			}
			if a.json {
				return writeJSON(a.stdout, out)
			}
			t := newTable(a.stdout, "TOPIC", "GROUP", "COMMITTED", "LAG")
			for _, g := range out {
				t.row(g.Topic, g.Group, fmt.Sprintf("%d/%d queues", g.Committed, g.Queues), strconv.FormatInt(g.Lag, 10))
			}
			return t.flush()
		},
	}
}

func (a *app) lagCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "lag GROUP TOPIC",
		Short: "Show a group's lag on a topic, per queue and in total",
		Long: `lag shows, per queue, the group's committed offset (the next it consumes),
the oldest retained and next offsets, and the lag: next - committed, or
next - oldest where the committed offset fell below the retained range
(marked "behind": messages dropped unread) or where nothing is committed
("-": the whole retained queue; where a group with no cursor starts
depends on its consumers' StartFrom).`,
		Example: `  ferry --store ./data lag billing orders
  ferry --store ./data lag billing orders --json`,
		Args: nArgs(2, 2),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := ctxOf(c)
			st, err := a.openRead()
			if err != nil {
				return err
			}
			defer st.Close()
			group, topic := args[0], args[1]
			meta, err := topicMeta(ctx, st, topic)
			if err != nil {
				return err
			}
			cur, err := st.Cursors(ctx, meta.Name, meta.Queues)
			if err != nil {
				return err
			}
			g, ok := cur.Groups[group]
			if !ok {
				return fmt.Errorf("group %q has no cursor on topic %q", group, meta.Name)
			}
			offs, err := queueOffsets(ctx, st, meta)
			if err != nil {
				return err
			}
			l := lagOf(meta.Name, group, g.Offsets, offs)
			if a.json {
				return writeJSON(a.stdout, l)
			}
			t := newTable(a.stdout, "QUEUE", "COMMITTED", "OLDEST", "NEXT", "LAG")
			for _, q := range l.Queues {
				lag := strconv.FormatInt(q.Lag, 10)
				if q.Behind {
					lag += " (behind: messages dropped unread)"
				}
				t.row(strconv.Itoa(q.Queue), offStr(q.Committed), strconv.FormatInt(q.Oldest, 10), strconv.FormatInt(q.Next, 10), lag)
			}
			t.row("TOTAL", "", "", "", strconv.FormatInt(l.Lag, 10))
			return t.flush()
		},
	}
}
