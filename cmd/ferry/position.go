package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferry"
)

// position is where a read or a reset starts in each queue.
type position struct {
	kind string // "earliest", "latest", "offset" or "time"
	off  int64
	t    time.Time
}

// parsePosition parses earliest, latest, offset:N (or N), time:RFC3339
// (or an RFC 3339 time), or a duration before now (-5m, 5m, time:-1h).
func parsePosition(s string, now time.Time) (position, error) {
	switch s {
	case "earliest", "oldest", "beginning":
		return position{kind: "earliest"}, nil
	case "latest", "end", "next":
		return position{kind: "latest"}, nil
	}
	v := s
	if rest, ok := strings.CutPrefix(s, "offset:"); ok {
		n, err := strconv.ParseInt(rest, 10, 64)
		if err != nil || n < 0 {
			return position{}, usageErrorf("bad position %q: offset:N wants N ≥ 0", s)
		}
		return position{kind: "offset", off: n}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
		return position{kind: "offset", off: n}, nil
	}
	v, _ = strings.CutPrefix(v, "time:")
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return position{kind: "time", t: t}, nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(v, "-")); err == nil && d >= 0 {
		return position{kind: "time", t: now.Add(-d)}, nil
	}
	return position{}, usageErrorf("bad position %q: want earliest, latest, offset:N, time:RFC3339 (2006-01-02T15:04:05Z) or a duration ago (-5m)", s)
}

func (p position) String() string {
	switch p.kind {
	case "offset":
		return fmt.Sprintf("offset %d", p.off)
	case "time":
		return "time " + p.t.UTC().Format(time.RFC3339Nano)
	}
	return p.kind
}

// resolve returns the offset of p in q: for a time, the first message
// stored at or after it, found by reading the queue from its oldest
// message (a scan: fine for an operator's command, linear in the queue's
// length), or next when there is none.
func (p position) resolve(ctx context.Context, q ferry.ReadableQueue) (int64, error) {
	oldest, next := q.Offsets()
	switch p.kind {
	case "earliest":
		return oldest, nil
	case "latest":
		return next, nil
	case "offset":
		if p.off < oldest || p.off > next {
			return 0, fmt.Errorf("offset %d of %s out of range: it retains [%d, %d)", p.off, q.ID(), oldest, next)
		}
		return p.off, nil
	}
	return firstAtOrAfter(ctx, q, p.t, oldest, next)
}

func firstAtOrAfter(ctx context.Context, q ferry.ReadableQueue, t time.Time, oldest, next int64) (int64, error) {
	dst := make([]*ferry.EnhancedMessage, 256)
	for off := oldest; off < next; {
		n, err := q.Read(ctx, off, dst)
		if errors.Is(err, ferry.ErrOffsetOutOfRange) { // retention moved on
			o, _ := q.Offsets()
			if o > off {
				off = o
				continue
			}
		}
		if err != nil {
			return 0, err
		}
		for _, m := range dst[:n] {
			if !m.StoreTime().Before(t) {
				return m.Offset, nil
			}
			off = m.Offset + 1
		}
	}
	return next, nil
}
