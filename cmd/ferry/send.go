package main

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferry"
)

func (a *app) sendCmd() *cobra.Command {
	var (
		key, tag string
		headers  []string
		queue    int
		create   bool
		queues   int
	)
	c := &cobra.Command{
		Use:   "send TOPIC [BODY...]",
		Short: "Send messages: each argument, or each line of standard input",
		Long: `send writes one message per BODY argument or, without any, one per line of
standard input. It opens the store as its owner: it is refused while another
process has the store open. The key routes a message to a queue (the
default router hashes it); --queue picks one.`,
		Example: `  ferry --store ./data send orders 'first' 'second'
  printf 'a\nb\n' | ferry --store ./data send orders --key user-1 --tag import
  ferry --store ./data send orders --header source=cli --queue 2 '{"id":7}'
  ferry --store ./data send new-topic --create --queues 4 hello`,
		Args: nArgs(1, -1),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := ctxOf(c)
			hs := map[string]string{}
			for _, h := range headers {
				k, v, ok := strings.Cut(h, "=")
				if !ok || k == "" {
					return usageErrorf("bad --header %q: want KEY=VALUE", h)
				}
				hs[k] = v
			}
			if len(hs) == 0 {
				hs = nil
			}
			loc, err := a.location()
			if err != nil {
				return err
			}
			topic := args[0]
			if err := ferry.ValidateTopicName(topic); err != nil {
				return usageErrorf("%v", err)
			}
			st, err := openWrite(loc, create)
			if err != nil {
				return err
			}
			defer st.Close()
			b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
			if err != nil {
				return err
			}
			defer b.Close()
			meta, ok := b.Topic(topic)
			if !ok {
				if !create {
					return fmt.Errorf("no topic %q in the store (--create --queues N creates it)", topic)
				}
				meta = ferry.TopicMeta{Name: topic, Queues: queues}
				if err := b.CreateTopic(ctx, meta); err != nil {
					return err
				}
			}
			var popts []ferry.ProducerOption
			if queue >= 0 {
				if queue >= meta.Queues {
					return usageErrorf("--queue %d: topic %q has queues 0 to %d", queue, topic, meta.Queues-1)
				}
				popts = append(popts, ferry.WithRouter(ferry.ManualRouter(queue)))
			}
			p, err := b.NewProducer(append(popts, ferry.WithProducerName("ferry-cli"))...)
			if err != nil {
				return err
			}
			defer p.Close()
			type sent struct {
				Queue  int    `json:"queue"`
				Offset int64  `json:"offset"`
				ID     string `json:"id,omitempty"`
			}
			var out []sent
			send := func(body string) error {
				r, err := p.Send(ctx, &ferry.Message{Topic: topic, Key: key, Tag: tag, Headers: hs, Body: []byte(body)})
				if err != nil {
					return err
				}
				s := sent{Queue: r.Queue.Queue, Offset: r.Offset}
				if !a.noTimes {
					s.ID = r.ID.String()
				}
				out = append(out, s)
				return nil
			}
			if len(args) > 1 {
				for _, body := range args[1:] {
					if err := send(body); err != nil {
						return err
					}
				}
			} else {
				sc := bufio.NewScanner(a.stdin)
				sc.Buffer(make([]byte, 64<<10), 16<<20)
				for sc.Scan() {
					if err := send(sc.Text()); err != nil {
						return err
					}
				}
				if err := sc.Err(); err != nil {
					return fmt.Errorf("reading standard input: %w", err)
				}
			}
			if err := errors.Join(p.Close(), b.Close(), st.Close()); err != nil {
				return err
			}
			if a.json {
				if out == nil {
					out = []sent{}
				}
				return writeJSON(a.stdout, out)
			}
			for _, s := range out {
				line := fmt.Sprintf("%s[%d]@%d", topic, s.Queue, s.Offset)
				if s.ID != "" {
					line += " id=" + s.ID
				}
				fmt.Fprintln(a.stdout, line)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&key, "key", "", "the messages' key (routes them to a queue)")
	f.StringVar(&tag, "tag", "", "the messages' tag")
	f.StringArrayVar(&headers, "header", nil, "a header KEY=VALUE (repeatable)")
	f.IntVar(&queue, "queue", -1, "write to this queue instead of routing by key")
	f.BoolVar(&create, "create", false, "create the store and the topic if missing")
	f.IntVar(&queues, "queues", 1, "with --create, the new topic's queue count")
	return c
}
