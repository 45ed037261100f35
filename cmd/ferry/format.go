package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferrymq/ferry"
)

// humanBytes formats n bytes with a binary unit: 512 B, 1.5 KiB, 64 MiB.
func humanBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(n) / 1024
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v < 10 {
		return fmt.Sprintf("%.1f %s", v, units[i])
	}
	return fmt.Sprintf("%.0f %s", v, units[i])
}

// ago formats how long before now t was: 3s ago, 5m ago, 2h ago, 4d ago.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	future := d < 0
	if future {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		s = "just now"
		return s
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		s = fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t *table) flush() error { return t.tw.Flush() }

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// retentionString describes a topic's retention.
func retentionString(r ferry.Retention) string {
	var parts []string
	if r.MaxMessages == ferry.Unlimited {
		parts = append(parts, "unlimited messages")
	} else {
		parts = append(parts, fmt.Sprintf("%d messages", r.MaxMessages))
	}
	if r.MaxBytes == ferry.Unlimited {
		parts = append(parts, "unlimited bytes")
	} else {
		parts = append(parts, humanBytes(r.MaxBytes))
	}
	if r.MaxAge > 0 {
		parts = append(parts, "max age "+r.MaxAge.String())
	} else {
		parts = append(parts, "no age bound")
	}
	return strings.Join(parts, ", ") + ", " + r.Overflow.String()
}

type retentionJSON struct {
	MaxMessages int64  `json:"max_messages"`
	MaxBytes    int64  `json:"max_bytes"`
	MaxAge      string `json:"max_age,omitempty"`
	Overflow    string `json:"overflow"`
}

func retentionOf(r ferry.Retention) retentionJSON {
	j := retentionJSON{MaxMessages: r.MaxMessages, MaxBytes: r.MaxBytes, Overflow: r.Overflow.String()}
	if r.MaxAge > 0 {
		j.MaxAge = r.MaxAge.String()
	}
	return j
}
