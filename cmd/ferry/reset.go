package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
)

func (a *app) resetCmd() *cobra.Command {
	var (
		to     string
		queue  int
		dryRun bool
	)
	c := &cobra.Command{
		Use:   "reset GROUP TOPIC --to earliest|latest|offset:N|time:RFC3339|-DURATION",
		Short: "Move a consumer group's cursor on a topic",
		Long: `reset commits a new cursor for GROUP on each queue of TOPIC (or --queue):
earliest (the oldest retained offset), latest (the next offset: skip
everything), offset:N, time:RFC3339, or a duration ago (-30s, -5m, -2h; or
time:-30s): the first message stored at or after that time, found by
reading each queue from its oldest message, a scan linear in the queue's
length. It opens the store as its owner, so it is refused while another
process, a running consumer's included, has it open.`,
		Example: `  ferry --store ./data reset billing orders --to earliest
  ferry --store ./data reset billing orders --to -30s
  ferry --store ./data reset billing orders --to time:2026-01-02T15:04:05Z --dry-run
  ferry --store ./data reset billing orders --to offset:120 --queue 0`,
		Args: nArgs(2, 2),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := ctxOf(c)
			group, topic := args[0], args[1]
			if to == "" {
				return usageErrorf("reset: --to is required (earliest, latest, offset:N, time:RFC3339 or a duration ago, -30s)")
			}
			pos, err := parsePosition(to, a.now())
			if err != nil {
				return err
			}
			if group == "" || len(group) > 255 {
				return usageErrorf("bad group name %q", group)
			}
			loc, err := a.location()
			if err != nil {
				return err
			}
			st, err := openWrite(loc, false)
			if err != nil {
				return err
			}
			defer st.Close()
			meta, err := topicMeta(ctx, st, topic)
			if err != nil {
				return err
			}
			if queue >= meta.Queues {
				return usageErrorf("--queue %d: topic %q has queues 0 to %d", queue, topic, meta.Queues-1)
			}
			before, err := st.Load(ctx, topic, group, meta.Queues)
			if err != nil {
				return err
			}
			type change struct {
				Queue int   `json:"queue"`
				From  int64 `json:"from"`
				To    int64 `json:"to"`
			}
			var changes []change
			for i := range meta.Queues {
				if queue >= 0 && i != queue {
					continue
				}
				q, err := st.OpenQueue(ctx, meta, i)
				if err != nil {
					return err
				}
				off, err := pos.resolve(ctx, q)
				if err != nil {
					return err
				}
				changes = append(changes, change{Queue: i, From: before[i], To: off})
			}
			if !dryRun {
				for _, ch := range changes {
					if err := st.Commit(ctx, topic, group, ch.Queue, ch.To); err != nil {
						return err
					}
				}
				if err := st.Close(); err != nil {
					return err
				}
			}
			if a.json {
				return writeJSON(a.stdout, map[string]any{"topic": topic, "group": group, "to": pos.String(), "dry_run": dryRun, "queues": changes})
			}
			verb := "reset"
			if dryRun {
				verb = "would reset (dry run)"
			}
			fmt.Fprintf(a.stdout, "%s group %s on %s to %s\n", verb, group, topic, pos)
			t := newTable(a.stdout, "QUEUE", "FROM", "TO")
			for _, ch := range changes {
				t.row(strconv.Itoa(ch.Queue), offStr(ch.From), strconv.FormatInt(ch.To, 10))
			}
			return t.flush()
		},
	}
	f := c.Flags()
	f.StringVar(&to, "to", "", "earliest, latest, offset:N, time:RFC3339 or a duration ago (-30s) (required)")
	f.IntVar(&queue, "queue", -1, "reset only this queue")
	f.BoolVar(&dryRun, "dry-run", false, "show what would change, commit nothing")
	return c
}
