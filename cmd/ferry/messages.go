package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferry"
)

// readOpts are the flags of cat and tail.
type readOpts struct {
	queue   int
	from    string
	key     string
	tag     string
	body    string
	limit   int
	lines   int
	follow  bool
	timeout time.Duration
}

func (o *readOpts) flags(c *cobra.Command, tail bool) {
	f := c.Flags()
	f.IntVarP(&o.queue, "queue", "q", -1, "read only this queue (default: every queue)")
	def := "earliest"
	if tail {
		def = ""
	}
	f.StringVar(&o.from, "from", def, "where to start in each queue: earliest, latest, offset:N, time:RFC3339 or a duration ago (-5m); a time is found by scanning")
	f.StringVar(&o.key, "key", "", "print only messages with this key")
	f.StringVar(&o.tag, "tag", "", "print only messages with this tag")
	f.StringVar(&o.body, "body", "text", "how to print bodies: text, hex or json")
	f.IntVar(&o.limit, "limit", 0, "stop after this many messages (0: no limit)")
	if tail {
		f.IntVarP(&o.lines, "lines", "n", 10, "start this many messages before the end of each queue (unless --from)")
		f.BoolVarP(&o.follow, "follow", "f", false, "keep printing new messages until interrupted (Ctrl-C), --limit or --timeout")
		f.DurationVar(&o.timeout, "timeout", 0, "with -f, stop after this long (0: never)")
	}
}

// msgJSON is a message as --json prints it, one per line.
type msgJSON struct {
	Topic       string            `json:"topic"`
	Queue       int               `json:"queue"`
	Offset      int64             `json:"offset"`
	ID          string            `json:"id,omitempty"`
	BornTime    *time.Time        `json:"born_time,omitempty"`
	StoreTime   *time.Time        `json:"store_time,omitempty"`
	Producer    string            `json:"producer,omitempty"`
	BornAddress string            `json:"born_address,omitempty"`
	Key         string            `json:"key,omitempty"`
	Tag         string            `json:"tag,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	Body        json.RawMessage   `json:"body"`
}

// printer prints messages as text or JSON lines.
type printer struct {
	a    *app
	w    io.Writer
	body string
	now  time.Time
}

func (p *printer) bodyJSON(b []byte) json.RawMessage {
	switch p.body {
	case "hex":
		j, _ := json.Marshal(hex.EncodeToString(b))
		return j
	case "json":
		if json.Valid(b) {
			var buf bytes.Buffer
			if err := json.Compact(&buf, b); err == nil {
				return buf.Bytes()
			}
		}
	}
	j, _ := json.Marshal(string(b))
	return j
}

func (p *printer) bodyText(b []byte) string {
	switch p.body {
	case "hex":
		return hex.EncodeToString(b)
	case "json":
		if json.Valid(b) {
			var buf bytes.Buffer
			if err := json.Compact(&buf, b); err == nil {
				return buf.String()
			}
		}
	}
	if !utf8.Valid(b) {
		return strconv.Quote(string(b))
	}
	return string(b)
}

func (p *printer) print(m *ferry.EnhancedMessage) error {
	if p.a.json {
		j := msgJSON{Topic: m.Topic, Queue: m.Queue, Offset: m.Offset, Key: m.Key, Tag: m.Tag, Headers: m.Headers, Body: p.bodyJSON(m.Body)}
		if !p.a.noTimes {
			bt, st := m.BornTime().UTC(), m.StoreTime().UTC()
			j.ID, j.BornTime, j.StoreTime, j.Producer, j.BornAddress = m.ID.String(), &bt, &st, m.ProducerName(), m.BornHost()
		}
		b, err := json.Marshal(j)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s@%d", m.QueueID(), m.Offset)
	if m.Key != "" {
		fmt.Fprintf(&sb, " key=%s", strconv.Quote(m.Key))
	}
	if m.Tag != "" {
		fmt.Fprintf(&sb, " tag=%s", strconv.Quote(m.Tag))
	}
	if len(m.Headers) > 0 {
		var hs []string
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			hs = append(hs, k+"="+strconv.Quote(m.Headers[k]))
		}
		fmt.Fprintf(&sb, " {%s}", strings.Join(hs, " "))
	}
	if !p.a.noTimes {
		fmt.Fprintf(&sb, " id=%s stored=%s (%s)", m.ID, m.StoreTime().UTC().Format(time.RFC3339Nano), ago(p.now, m.StoreTime()))
	}
	_, err := fmt.Fprintf(p.w, "%s\n%s\n", sb.String(), p.bodyText(m.Body))
	return err
}

func (o *readOpts) match(m *ferry.EnhancedMessage) bool {
	return (o.key == "" || m.Key == o.key) && (o.tag == "" || m.Tag == o.tag)
}

func (a *app) catCmd() *cobra.Command {
	o := &readOpts{}
	c := &cobra.Command{
		Use:   "cat TOPIC",
		Short: "Print a topic's messages, from --from to the end as it is now",
		Long: `cat prints the messages of a topic, queue by queue, from --from (default
earliest) to the end each queue has when cat starts. Each message is a line
"topic[queue]@offset key=... tag=... {headers} id=... stored=..." and its
body; --json prints one JSON object per line instead.`,
		Example: `  ferry --store ./data cat orders
  ferry --store ./data cat orders --queue 1 --from offset:100 --limit 10
  ferry --store ./data cat orders --from time:2026-01-02T15:04:05Z --tag urgent
  ferry --store ./data cat orders --json --body json | jq .body`,
		Args: nArgs(1, 1),
		RunE: func(c *cobra.Command, args []string) error { return a.read(c, args[0], o, false) },
	}
	o.flags(c, false)
	return c
}

func (a *app) tailCmd() *cobra.Command {
	o := &readOpts{}
	c := &cobra.Command{
		Use:   "tail TOPIC",
		Short: "Print a topic's last messages; with -f, follow new ones",
		Long: `tail prints the last --lines messages of each queue (or from --from), and
with -f keeps printing messages as they are written, until interrupted
(Ctrl-C), or --limit messages were printed, or --timeout passed; each ends
it with exit status 0. It reads the store without its lock, while its
owner writes.`,
		Example: `  ferry --store ./data tail orders
  ferry --store ./data tail -f orders --tag urgent
  ferry --store ./data tail -f orders --from latest --limit 1 --timeout 30s`,
		Args: nArgs(1, 1),
		RunE: func(c *cobra.Command, args []string) error { return a.read(c, args[0], o, true) },
	}
	o.flags(c, true)
	return c
}

// read runs cat (tail false) and tail.
func (a *app) read(c *cobra.Command, topic string, o *readOpts, tail bool) error {
	ctx := ctxOf(c)
	switch o.body {
	case "text", "hex", "json":
	default:
		return usageErrorf("bad --body %q: want text, hex or json", o.body)
	}
	if o.limit < 0 || o.lines < 0 {
		return usageErrorf("--limit and --lines must not be negative")
	}
	var pos *position
	if o.from != "" {
		p, err := parsePosition(o.from, a.now())
		if err != nil {
			return err
		}
		pos = &p
	}
	st, err := a.openRead()
	if err != nil {
		return err
	}
	defer st.Close()
	meta, err := topicMeta(ctx, st, topic)
	if err != nil {
		return err
	}
	queues := []int{}
	if o.queue >= 0 {
		if o.queue >= meta.Queues {
			return usageErrorf("--queue %d: topic %q has queues 0 to %d", o.queue, topic, meta.Queues-1)
		}
		queues = append(queues, o.queue)
	} else {
		for i := range meta.Queues {
			queues = append(queues, i)
		}
	}
	type start struct {
		q        ferry.Queue
		from, to int64
		damage   error // where the queue's readable messages end, if they end at damage
	}
	var starts []start
	for _, i := range queues {
		q, err := st.OpenQueue(ctx, meta, i)
		if err != nil {
			return err
		}
		defer q.Close()
		damage := queueDamage(ctx, st, meta, i)
		if damage != nil && !errors.Is(damage, ferry.ErrCorrupt) {
			return damage
		}
		oldest, next := q.Offsets()
		from := max(oldest, next-int64(o.lines))
		if pos != nil {
			if from, err = pos.resolve(ctx, q); err != nil {
				if damage != nil { // the offsets from next on lie beyond it
					return damage
				}
				return err
			}
		}
		starts = append(starts, start{q: q, from: from, to: next, damage: damage})
	}
	p := &printer{a: a, w: a.stdout, body: o.body, now: a.now()}
	printed := 0
	if !o.follow {
		dst := make([]*ferry.EnhancedMessage, 256)
		for _, s := range starts {
			for off := s.from; off < s.to; {
				n, err := s.q.Read(ctx, off, dst[:min(int64(len(dst)), s.to-off)])
				if errors.Is(err, ferry.ErrOffsetOutOfRange) {
					oldest, _ := s.q.Offsets()
					if oldest > off {
						fmt.Fprintf(a.stderr, "ferry: %s: messages %d to %d dropped by retention while reading\n", s.q.ID(), off, oldest-1)
						off = oldest
						continue
					}
				}
				if err != nil {
					return err
				}
				for _, m := range dst[:n] {
					off = m.Offset + 1
					if !o.match(m) {
						continue
					}
					if err := p.print(m); err != nil {
						return err
					}
					if printed++; o.limit > 0 && printed >= o.limit {
						return nil
					}
				}
			}
			if s.damage != nil {
				return s.damage
			}
		}
		return nil
	}

	// Follow: a reader per queue, the printer here.
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan *ferry.EnhancedMessage, 256)
	errc := make(chan error, len(starts))
	var wg sync.WaitGroup
	for _, s := range starts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]*ferry.EnhancedMessage, 256)
			for off := s.from; ; {
				n, err := s.q.Read(ctx, off, dst)
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, ferry.ErrOffsetOutOfRange) {
					if oldest, _ := s.q.Offsets(); oldest > off {
						fmt.Fprintf(a.stderr, "ferry: %s: messages %d to %d dropped by retention before they were read\n", s.q.ID(), off, oldest-1)
						off = oldest
						continue
					}
				}
				if err != nil {
					errc <- err
					return
				}
				for _, m := range dst[:n] {
					select {
					case msgs <- m:
					case <-ctx.Done():
						return
					}
					off = m.Offset + 1
				}
			}
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil // interrupted, or --timeout
		case err := <-errc:
			return err
		case m := <-msgs:
			if !o.match(m) {
				continue
			}
			p.now = a.now()
			if err := p.print(m); err != nil {
				return err
			}
			if printed++; o.limit > 0 && printed >= o.limit {
				return nil
			}
		}
	}
}
