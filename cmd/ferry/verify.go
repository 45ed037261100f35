package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferry/filestore"
)

func (a *app) verifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify [DIR]",
		Short: "Check every frame, index, metadata and cursor file of a store",
		Long: `verify reads every file of the store in DIR (or --store) and checks it:
each frame's checksum, tag and offsets and each message's encoding, each
index against its segment, each topic's metadata, the identity and the
cursor file. It writes nothing and takes no lock, so it may run while the
owner writes: the end of a queue's newest segment is then space reserved
ahead of the owner's writes or a write in progress, told from damage as the
owner's Open tells a torn tail from damage, and never reported as damage.

Each problem is printed with its file and byte. DAMAGE is what the owner's
Open refuses or what loses messages; a note is what Open repairs by itself
(a torn tail, an index to rebuild, a cursor to clamp). The bytes after the
last frame of newest segments (the live owner's reserved space, or torn
tails after a crash) are one note for all of them; --json lists each.

Exit status: 0 no damage (notes allowed), 3 damage found, 1 the store
could not be read.`,
		Example: `  ferry verify /var/lib/app/ferry
  ferry verify --json ./data | jq '.problems[] | select(.damage)'`,
		Args: nArgs(0, 1),
		RunE: func(c *cobra.Command, args []string) error {
			raw := a.store
			if len(args) == 1 {
				raw = args[0]
			}
			loc, err := parseLocation(raw)
			if err != nil {
				return err
			}
			rep, err := filestore.Verify(loc.Path)
			if err != nil {
				return err
			}
			if a.json {
				type problemJSON struct {
					File     string `json:"file"`
					Offset   int64  `json:"offset"`
					Error    string `json:"error"`
					Damage   bool   `json:"damage"`
					TornTail bool   `json:"torn_tail,omitempty"`
				}
				ps := []problemJSON{}
				for _, p := range rep.Problems {
					ps = append(ps, problemJSON{p.File, p.Offset, p.Err, p.Damage, p.TornTail})
				}
				if err := writeJSON(a.stdout, map[string]any{
					"dir": loc.Path, "topics": rep.Topics, "queues": rep.Queues, "segments": rep.Segments,
					"frames": rep.Frames, "messages": rep.Messages, "bytes": rep.Bytes, "cursors": rep.Cursors,
					"damaged": rep.Damaged(), "problems": ps,
				}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(a.stdout, "checked %d topics, %d queues, %d segments (%s), %d frames, %d messages, %d cursors\n",
					rep.Topics, rep.Queues, rep.Segments, humanBytes(rep.Bytes), rep.Frames, rep.Messages, rep.Cursors)
				var tails []filestore.Problem
				for _, p := range rep.Problems {
					if p.TornTail {
						tails = append(tails, p)
						continue
					}
					fmt.Fprintln(a.stdout, p)
				}
				switch {
				case len(tails) == 1:
					fmt.Fprintln(a.stdout, tails[0])
				case len(tails) > 1:
					fmt.Fprintf(a.stdout, "note: %d newest segments end in bytes after their last frame (space reserved or a write in progress while the owner runs; torn tails after a crash, which Open cuts), the first %s at byte %d (--json lists each)\n",
						len(tails), tails[0].File, tails[0].Offset)
				}
			}
			if rep.Damaged() {
				n := 0
				for _, p := range rep.Problems {
					if p.Damage {
						n++
					}
				}
				return &exitErr{code: exitDamage, err: fmt.Errorf("damage found in %s: %d damaged files or frames", loc.Path, n)}
			}
			if !a.json {
				fmt.Fprintln(a.stdout, "no damage")
			}
			return nil
		},
	}
}
