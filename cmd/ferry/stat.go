package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferry"
)

func (a *app) statCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stat",
		Short: "Show the store's sizes and counts, and what its next Open would repair or refuse",
		Long: `stat sums up the store: topics, queues, messages, segment and index files,
cursors and groups; and lists what the owner's next Open would repair by
itself: bytes after the last frame of a newest segment (while the owner runs,
space reserved ahead of its writes; after a crash, a torn tail), cursors
outside their queue's retained range. Damage that the next Open refuses (a
bad frame with intact ones after it, told from a torn tail as Open tells it)
is listed instead, with its file and byte, and stat exits with status 3; the
message count then stops at the damage. It reads no frame beyond what it
needs to find the offsets and judge the tails; verify checks every one.`,
		Example: `  ferry --store ./data stat
  ferry --store ./data stat --json`,
		Args: nArgs(0, 0),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := ctxOf(c)
			st, err := a.openRead()
			if err != nil {
				return err
			}
			defer st.Close()
			type statJSON struct {
				Dir         string   `json:"dir"`
				ID          string   `json:"id,omitempty"`
				Topics      int      `json:"topics"`
				Queues      int      `json:"queues"`
				Messages    int64    `json:"messages"`
				Segments    int      `json:"segments"`
				SegmentSize int64    `json:"segment_bytes"`
				Indexes     int      `json:"indexes"`
				IndexSize   int64    `json:"index_bytes"`
				Cursors     int      `json:"cursors"`
				Groups      int      `json:"groups"`
				Recovery    []string `json:"recovery"`
				// Damaged: the next Open refuses the store; Messages
				// stops at the damage, Damage lists it.
				Damaged bool     `json:"damaged,omitempty"`
				Damage  []string `json:"damage,omitempty"`
			}
			loc, _ := a.location()
			s := statJSON{Dir: loc.Path, Recovery: []string{}}
			if idr, ok := st.(interface{ ID() string }); ok && !a.noTimes {
				s.ID = idr.ID()
			}
			metas, err := st.Topics(ctx)
			if err != nil {
				return err
			}
			groups := map[string]bool{}
			for _, meta := range metas {
				s.Topics++
				offs, err := offsetsOf(ctx, st, meta)
				if err != nil {
					return err
				}
				for i, o := range offs {
					s.Queues++
					s.Messages += o[1] - o[0]
					if sl, ok := st.(segmentLister); ok {
						segs, err := sl.Segments(ctx, meta.Name, i)
						if err != nil {
							return err
						}
						if err := segmentDamage(ferry.QueueID{Topic: meta.Name, Queue: i}, segs); err != nil {
							s.Damaged = true
							s.Damage = append(s.Damage, strings.TrimPrefix(err.Error(), "ferry: "))
						}
						for j, sg := range segs {
							s.Segments++
							s.SegmentSize += sg.Bytes
							if sg.IndexBytes > 0 {
								s.Indexes++
								s.IndexSize += sg.IndexBytes
							}
							if tail := sg.Bytes - sg.Frames; tail > 0 && j == len(segs)-1 && !sg.Damage {
								s.Recovery = append(s.Recovery, fmt.Sprintf("%s: cut %d bytes after the last frame (space reserved while the owner writes, or a torn tail)", sg.File, tail))
							}
							if sg.Sealed && sg.IndexBytes == 0 {
								s.Recovery = append(s.Recovery, fmt.Sprintf("%s: rebuild the missing index", sg.File))
							}
						}
					}
				}
				cur, err := st.Cursors(ctx, meta.Name, meta.Queues)
				if err != nil {
					return err
				}
				for _, g := range slices.Sorted(mapKeys(cur.Groups)) {
					groups[meta.Name+"\x00"+g] = true
					for i, off := range cur.Groups[g].Offsets {
						if off < 0 {
							continue
						}
						s.Cursors++
						if off < offs[i][0] || off > offs[i][1] {
							s.Recovery = append(s.Recovery, fmt.Sprintf("clamp the cursor of group %q on %s[%d] from %d into [%d, %d]", g, meta.Name, i, off, offs[i][0], offs[i][1]))
						}
					}
				}
			}
			s.Groups = len(groups)
			if s.Damaged { // it repairs nothing then
				s.Recovery = []string{}
			}
			damaged := &exitErr{code: exitDamage, err: fmt.Errorf("damage found in %s: the next Open refuses the store (ferry verify lists every problem)", s.Dir)}
			if a.json {
				if err := writeJSON(a.stdout, s); err != nil || !s.Damaged {
					return err
				}
				return damaged
			}
			id := ""
			if s.ID != "" {
				id = " (id " + s.ID + ")"
			}
			msgs := strconv.FormatInt(s.Messages, 10)
			if s.Damaged {
				msgs = "at least " + msgs + " (damage hides the rest: see recovery)"
			}
			fmt.Fprintf(a.stdout, "store:     %s%s\ntopics:    %d\nqueues:    %d\nmessages:  %s\nsegments:  %d, %s\nindexes:   %d, %s\ntotal:     %s\ncursors:   %d, of %d groups\n",
				s.Dir, id, s.Topics, s.Queues, msgs, s.Segments, humanBytes(s.SegmentSize), s.Indexes, humanBytes(s.IndexSize),
				humanBytes(s.SegmentSize+s.IndexSize), s.Cursors, s.Groups)
			if s.Damaged {
				fmt.Fprintln(a.stdout, "recovery:  the next open refuses the store:")
				for _, d := range s.Damage {
					fmt.Fprintln(a.stdout, "  - DAMAGE:", d)
				}
				return damaged
			}
			if len(s.Recovery) == 0 {
				fmt.Fprintln(a.stdout, "recovery:  nothing to repair at the next open")
				return nil
			}
			fmt.Fprintln(a.stdout, "recovery:  the next open would")
			for _, r := range s.Recovery {
				fmt.Fprintln(a.stdout, "  -", r)
			}
			return nil
		},
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
