package ferry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The Buffer property test: random operations on a Buffer and on a plain
// model of one, compared after every step. Set FERRY_BUFFER_SEED to replay
// a failing run.

// Model entry states. Finished entries leave the model.
const (
	mPending   = iota // put, not taken
	mInFlight         // taken, not done
	mAbandoned        // taken, given up: unfinished but not in flight
)

type modelEntry struct {
	m     *EnhancedMessage
	size  int64
	state int
}

// bufModel is the buffer's contract written out plainly: the unfinished
// messages in offset order, and counts derived from them when asked.
type bufModel struct {
	cfg                 BufferConfig
	highMsgs, lowMsgs   int
	highBytes, lowBytes int64

	entries        []*modelEntry // unfinished, by offset
	sum            int64         // their sizes, recounted in stats
	next           int64
	wantOff        int64 // the message Put last waited for or left out
	wantSize       int64
	full           bool
	closed         bool
	locked         bool
	peakM          int
	peakB          int64
	blockedPutMsgs []*EnhancedMessage // a Put waiting in a goroutine, if any
}

func newBufModel(cfg BufferConfig) *bufModel {
	md := &bufModel{cfg: cfg}
	// Watermarks round down, high to at least 1, low to below high.
	md.highMsgs = max(1, int(float64(cfg.MaxMessages)*cfg.HighWatermark))
	md.lowMsgs = min(int(float64(cfg.MaxMessages)*cfg.LowWatermark), md.highMsgs-1)
	md.highBytes = max(1, int64(float64(cfg.MaxBytes)*cfg.HighWatermark))
	md.lowBytes = min(int64(float64(cfg.MaxBytes)*cfg.LowWatermark), md.highBytes-1)
	return md
}

func (md *bufModel) count() int { return len(md.entries) }

func (md *bufModel) bytes() int64 { return md.sum }

func (md *bufModel) countState(s int) int {
	n := 0
	for _, e := range md.entries {
		if e.state == s {
			n++
		}
	}
	return n
}

// oldest is the committable offset.
func (md *bufModel) oldest() int64 {
	if len(md.entries) > 0 {
		return md.entries[0].m.Offset
	}
	return md.next
}

// settle ends a watermark pause once the buffer is at its low watermark.
func (md *bufModel) settle() {
	if md.full && md.count() <= md.lowMsgs && md.bytes() <= md.lowBytes {
		md.full = false
	}
}

// canTake reports whether Put may take a message of size at off now.
func (md *bufModel) canTake(off, size int64) bool {
	md.settle()
	if md.count() == 0 {
		return true
	}
	return !md.full && md.count() < md.highMsgs && md.bytes()+size <= md.highBytes &&
		off-md.oldest() < md.cfg.MaxSpan
}

func (md *bufModel) paused() bool {
	if md.wantOff >= md.next {
		return !md.canTake(md.wantOff, md.wantSize)
	}
	return !md.canTake(md.next, 0)
}

func (md *bufModel) check(m *EnhancedMessage) error {
	if m == nil {
		return ErrInvalidMessage
	}
	if m.Offset < md.next {
		return ErrOffsetOutOfRange
	}
	return nil
}

// put is Put; waits reports that Put would wait (and with cancelled set
// it returned ctx's error, which put returns as context.Canceled).
func (md *bufModel) put(msgs []*EnhancedMessage, cancelled bool) (n int, err error, waits bool) {
	if len(msgs) == 0 {
		return 0, nil, false
	}
	if md.closed {
		return 0, ErrClosed, false
	}
	if err := md.check(msgs[0]); err != nil {
		return 0, err, false
	}
	md.wantOff, md.wantSize = msgs[0].Offset, int64(msgs[0].Size())
	if md.paused() {
		if cancelled {
			return 0, context.Canceled, true
		}
		return 0, nil, true
	}
	for _, m := range msgs {
		if err = md.check(m); err != nil {
			break
		}
		size := int64(m.Size())
		if !md.canTake(m.Offset, size) {
			md.wantOff, md.wantSize = m.Offset, size
			if md.count() >= md.highMsgs || md.bytes()+size > md.highBytes {
				md.full = true
			}
			break
		}
		md.entries = append(md.entries, &modelEntry{m: m, size: size})
		md.sum += size
		md.next = m.Offset + 1
		n++
		if md.count() >= md.highMsgs || md.bytes() >= md.highBytes {
			md.full = true
		}
	}
	md.peakM = max(md.peakM, md.count())
	md.peakB = max(md.peakB, md.bytes())
	md.settle()
	return n, err, false
}

func (md *bufModel) take(k int) (taken []*EnhancedMessage, pending int) {
	if md.closed {
		return nil, 0
	}
	for _, e := range md.entries {
		if e.state == mPending && len(taken) < k {
			e.state = mInFlight
			taken = append(taken, e.m)
		}
	}
	return taken, md.countState(mPending)
}

func (md *bufModel) done(msgs []*EnhancedMessage) int64 {
	finished := make(map[*EnhancedMessage]bool)
	for _, m := range msgs {
		finished[m] = true
	}
	kept := md.entries[:0]
	md.sum = 0
	for _, e := range md.entries {
		if !finished[e.m] || e.state == mPending {
			kept = append(kept, e)
			md.sum += e.size
		}
	}
	clear(md.entries[len(kept):])
	md.entries = kept
	md.settle()
	return md.oldest()
}

func (md *bufModel) abandon(msgs []*EnhancedMessage) {
	given := make(map[*EnhancedMessage]bool)
	for _, m := range msgs {
		given[m] = true
	}
	for _, e := range md.entries {
		if given[e.m] && e.state == mInFlight {
			e.state = mAbandoned
		}
	}
}

func (md *bufModel) advance(next int64) bool {
	if next <= md.next {
		return false
	}
	md.next = next
	return md.count() == 0
}

func (md *bufModel) reset(next int64) {
	md.entries, md.sum = nil, 0
	md.next, md.wantOff, md.wantSize = next, 0, 0
	md.full = false
	md.peakM, md.peakB = 0, 0
}

func (md *bufModel) stats() BufferStats {
	var sum int64
	for _, e := range md.entries {
		sum += e.size
	}
	if sum != md.sum {
		panic(fmt.Sprintf("model: bytes %d, entries hold %d", md.sum, sum))
	}
	return BufferStats{
		Messages:     md.count(),
		Bytes:        md.bytes(),
		Pending:      md.countState(mPending),
		InFlight:     md.countState(mInFlight),
		PeakMessages: md.peakM,
		PeakBytes:    md.peakB,
		Paused:       md.count() > 0 && md.paused(),
		Committable:  md.oldest(),
	}
}

// modelRun drives one buffer and its model with one random source.
type modelRun struct {
	t     *testing.T
	r     *rand.Rand
	bulk  int // the most messages one Put, Take or Done moves
	b     *Buffer
	md    *bufModel
	trace []string
	all   []*EnhancedMessage // every message made, for Done and abandon
	tail  []*EnhancedMessage // what the last Put left out, to put again
	wait  chan putOutcome    // the waiting Put's result, if one waits
}

type putOutcome struct {
	n   int
	err error
}

func (mr *modelRun) logf(format string, args ...any) {
	mr.trace = append(mr.trace, fmt.Sprintf(format, args...))
}

func (mr *modelRun) fail(format string, args ...any) {
	mr.t.Helper()
	tr := mr.trace
	if len(tr) > 40 {
		tr = tr[len(tr)-40:]
	}
	mr.t.Fatalf("%s\nconfig %+v (high %d msgs %d B, low %d msgs %d B)\nlast steps:\n  %s",
		fmt.Sprintf(format, args...), mr.md.cfg, mr.md.highMsgs, mr.md.highBytes,
		mr.md.lowMsgs, mr.md.lowBytes, strings.Join(tr, "\n  "))
}

func (mr *modelRun) requireErr(want, got error, what string) {
	mr.t.Helper()
	if (want == nil) != (got == nil) || (want != nil && !errors.Is(got, want)) {
		mr.fail("%s: error %v, model %v", what, got, want)
	}
}

// size draws a message size: mostly small, sometimes over the buffer.
func (mr *modelRun) size() int {
	if mr.bulk > 10 {
		return mr.r.IntN(64)
	}
	bound := int(mr.md.highBytes)
	switch mr.r.IntN(10) {
	case 0:
		return 0
	case 2, 3:
		return 1 // so the bytes land exactly on a watermark
	case 1:
		return bound + mr.r.IntN(2*bound+1) // larger than the buffer
	default:
		return mr.r.IntN(bound/3 + 2)
	}
}

func (mr *modelRun) newMsg(off int64) *EnhancedMessage {
	m := &EnhancedMessage{Message: Message{Topic: "t", Body: make([]byte, mr.size())}, Offset: off}
	mr.all = append(mr.all, m)
	return m
}

// batch makes what the fetch loop would put: the tail left out last time,
// or new messages from next with gaps; now and then a bad one.
func (mr *modelRun) batch() []*EnhancedMessage {
	var msgs []*EnhancedMessage
	if len(mr.tail) > 0 && mr.tail[0] != nil && mr.tail[0].Offset >= mr.md.next && mr.r.IntN(3) > 0 {
		msgs = append(msgs, mr.tail...)
	} else {
		off := mr.md.next
		for range 1 + mr.r.IntN(mr.bulk) {
			off += int64(mr.r.IntN(3) / 2 * mr.r.IntN(4)) // mostly contiguous
			msgs = append(msgs, mr.newMsg(off))
			off++
		}
	}
	if mr.r.IntN(25) == 0 {
		i := mr.r.IntN(len(msgs))
		if mr.md.next > 0 && mr.r.IntN(2) == 0 {
			msgs[i] = mr.newMsg(mr.r.Int64N(mr.md.next))
		} else {
			msgs[i] = nil
		}
	}
	return msgs
}

// pick draws messages for Done or abandon: taken ones mostly, but also
// pending, finished, forgotten and nil ones, which both ignore.
func (mr *modelRun) pick() []*EnhancedMessage {
	var out []*EnhancedMessage
	if mr.bulk > 10 && mr.r.IntN(3) > 0 {
		// A worker finishing the oldest taken messages, so the oldest
		// unfinished offset moves far and the buffer compacts.
		for _, e := range mr.md.entries {
			if len(out) == mr.bulk {
				break
			}
			if e.state != mPending {
				out = append(out, e.m)
			}
		}
		return out
	}
	for range 1 + mr.r.IntN(mr.bulk*2/3+1) {
		switch k := mr.r.IntN(10); {
		case k < 7 && len(mr.md.entries) > 0:
			out = append(out, mr.md.entries[mr.r.IntN(len(mr.md.entries))].m)
		case k < 9 && len(mr.all) > 0:
			out = append(out, mr.all[mr.r.IntN(len(mr.all))])
		default:
			out = append(out, nil)
		}
	}
	return out
}

func fmtMsgs(msgs []*EnhancedMessage) string {
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		if m == nil {
			parts[i] = "nil"
		} else {
			parts[i] = strconv.FormatInt(m.Offset, 10) + ":" + strconv.Itoa(m.Size())
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func (mr *modelRun) put() {
	msgs := mr.batch()
	// With the model predicting a wait, Put gets a cancelled context and
	// must say so, or it waits in a goroutine for a later step to free
	// room. Otherwise it gets a context that only a hang would end.
	cancelled := mr.r.IntN(2) == 0
	n, merr, waits := mr.md.put(msgs, cancelled)
	mr.logf("Put%s cancelled=%v -> model %d %v waits=%v", fmtMsgs(msgs), cancelled, n, merr, waits)
	if waits && !cancelled {
		cctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := mr.b.Put(cctx, msgs); !errors.Is(err, context.Canceled) {
			mr.fail("Put did not wait: %v", err)
		}
		mr.md.blockedPutMsgs = msgs
		mr.wait = make(chan putOutcome, 1)
		go func(ch chan<- putOutcome) {
			n, err := mr.b.Put(context.Background(), msgs)
			ch <- putOutcome{n, err}
		}(mr.wait)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if cancelled {
		cancel()
	}
	got, err := mr.b.Put(ctx, msgs)
	cancel()
	mr.requireErr(merr, err, "Put")
	if got != n {
		mr.fail("Put took %d, model %d", got, n)
	}
	if merr == nil && n == 0 && len(msgs) > 0 && !waits {
		mr.fail("Put returned 0 with no error")
	}
	mr.tail = msgs[n:]
}

// wake settles a waiting Put once the model says it can go on.
func (mr *modelRun) wake() {
	if mr.wait == nil {
		return
	}
	msgs, md := mr.md.blockedPutMsgs, mr.md
	if !md.closed && md.check(msgs[0]) == nil {
		md.wantOff, md.wantSize = msgs[0].Offset, int64(msgs[0].Size())
		if md.paused() {
			select {
			case got := <-mr.wait:
				mr.fail("waiting Put returned %d, %v while the model waits", got.n, got.err)
			default:
			}
			return
		}
	}
	n, merr, _ := md.put(msgs, false)
	mr.logf("  waiting Put -> model %d %v", n, merr)
	var got putOutcome
	select {
	case got = <-mr.wait:
	case <-time.After(10 * time.Second):
		mr.fail("waiting Put was not woken")
	}
	mr.wait, mr.md.blockedPutMsgs = nil, nil
	mr.requireErr(merr, got.err, "waiting Put")
	if got.n != n {
		mr.fail("waiting Put took %d, model %d", got.n, n)
	}
	mr.tail = msgs[n:]
}

func (mr *modelRun) step() {
	r, b, md := mr.r, mr.b, mr.md
	op := r.IntN(100)
	if op >= 90 && op < 95 && mr.bulk > 10 && r.IntN(20) > 0 {
		op = 99 // a bulk run rarely resets or closes, so its buffer grows
	}
	switch {
	case op < 25:
		if mr.wait == nil {
			mr.put()
		}
	case op < 45:
		k := r.IntN(mr.bulk*2/3 + 2)
		dst := make([]*EnhancedMessage, k)
		var want []*EnhancedMessage
		var n, pending, mpend int
		if r.IntN(3) == 0 {
			// takeShare: ceil(pending/ways), at least 1 and least, at
			// most len(dst).
			ways, least := 1+r.IntN(3), r.IntN(3)
			share := min(k, max(1, least, (md.countState(mPending)+ways-1)/ways))
			want, mpend = md.take(share)
			mr.logf("takeShare(%d, ways %d, least %d) -> model %s pending %d", k, ways, least, fmtMsgs(want), mpend)
			n, pending = b.takeShare(dst, ways, least)
		} else {
			want, mpend = md.take(k)
			mr.logf("Take(%d) -> model %s pending %d", k, fmtMsgs(want), mpend)
			n, pending = b.Take(dst)
		}
		if n != len(want) || pending != mpend {
			mr.fail("took %d pending %d, model %d pending %d", n, pending, len(want), mpend)
		}
		for i := range want {
			if dst[i] != want[i] {
				mr.fail("took %s, model %s", fmtMsgs(dst[:n]), fmtMsgs(want))
			}
		}
	case op < 65:
		msgs := mr.pick()
		want := md.done(msgs)
		mr.logf("Done%s -> model %d", fmtMsgs(msgs), want)
		if got := b.Done(msgs...); got != want {
			mr.fail("Done returned %d, model %d", got, want)
		}
		mr.wake()
	case op < 70:
		msgs := mr.pick()
		md.abandon(msgs)
		mr.logf("abandon%s", fmtMsgs(msgs))
		b.abandon(msgs...)
	case op < 78:
		next := md.next - 2 + r.Int64N(6)
		want := md.advance(next)
		mr.logf("advance(%d) -> model %v", next, want)
		if got := b.advance(next); got != want {
			mr.fail("advance returned %v, model %v", got, want)
		}
		mr.wake()
	case op < 86:
		switch r.IntN(4) {
		case 0:
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := b.Lock(ctx)
			mr.logf("Lock(cancelled) locked=%v", md.locked)
			if md.locked {
				mr.requireErr(context.Canceled, err, "Lock")
			} else {
				mr.requireErr(nil, err, "Lock")
			}
			md.locked = true
		case 1:
			mr.logf("TryLock locked=%v", md.locked)
			if got := b.TryLock(); got == md.locked {
				mr.fail("TryLock %v with the lock held %v", got, md.locked)
			}
			md.locked = true
		default:
			mr.logf("Unlock")
			b.Unlock()
			md.locked = false
		}
	case op < 90:
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := b.WaitDrained(ctx)
		mr.logf("WaitDrained(cancelled), model in flight %d", md.countState(mInFlight))
		if md.countState(mInFlight) == 0 {
			mr.requireErr(nil, err, "WaitDrained")
		} else {
			mr.requireErr(context.Canceled, err, "WaitDrained")
		}
	case op < 94:
		next := max(0, md.next-5+r.Int64N(10))
		mr.logf("Reset(%d)", next)
		md.reset(next)
		b.Reset(next)
		mr.tail = nil
		mr.wake()
	case op < 95:
		mr.logf("Close")
		md.closed = true
		b.Close()
		mr.wake()
	default:
		mr.logf("Next/Pending/Committable")
	}
	mr.compare()
}

func (mr *modelRun) compare() {
	mr.t.Helper()
	want := mr.md.stats()
	if got := mr.b.Stats(); got != want {
		mr.fail("Stats\n got   %+v\n model %+v", got, want)
	}
	if got := mr.b.Next(); got != mr.md.next {
		mr.fail("Next %d, model %d", got, mr.md.next)
	}
	if got := mr.b.Pending(); got != want.Pending {
		mr.fail("Pending %d, model %d", got, want.Pending)
	}
	if got := mr.b.Committable(); got != want.Committable {
		mr.fail("Committable %d, model %d", got, want.Committable)
	}
	// The span: nothing unfinished at or beyond oldest + MaxSpan, unless
	// it went in alone.
	if n := len(mr.md.entries); n > 1 {
		if d := mr.md.entries[n-1].m.Offset - mr.md.entries[0].m.Offset; d >= mr.md.cfg.MaxSpan {
			mr.fail("span %d with max %d", d, mr.md.cfg.MaxSpan)
		}
	}
}

// randomConfig draws a valid config: small, so limits are hit often.
// A bulk config holds thousands of messages, so Done compacts its entries.
func randomConfig(r *rand.Rand, bulk bool) BufferConfig {
	if bulk {
		return BufferConfig{
			MaxMessages:   1200 + r.IntN(1500),
			MaxBytes:      1 << 20,
			HighWatermark: 1,
			LowWatermark:  r.Float64(),
			MaxSpan:       1500 + r.Int64N(3000),
		}
	}
	if r.IntN(6) == 0 {
		// Both byte watermarks round down to k bytes.
		maxBytes := 2 + r.Int64N(60)
		k := 1 + r.Int64N(maxBytes-1)
		return BufferConfig{
			MaxMessages:   1 + r.IntN(40),
			MaxBytes:      maxBytes,
			HighWatermark: (float64(k) + 0.6) / float64(maxBytes),
			LowWatermark:  (float64(k) + 0.3) / float64(maxBytes),
			MaxSpan:       1 + r.Int64N(40),
		}
	}
	high := 0.05 + 0.95*r.Float64()
	if r.IntN(4) == 0 {
		high = 1
	}
	low := high * r.Float64()
	return BufferConfig{
		MaxMessages:   1 + r.IntN(12),
		MaxBytes:      1 + r.Int64N(200),
		HighWatermark: high,
		LowWatermark:  low,
		MaxSpan:       1 + r.Int64N(16),
	}
}

func TestBufferAgainstModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FERRY_BUFFER_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (FERRY_BUFFER_SEED replays it)", seed)
	iterations, steps := 400, 250
	if testing.Short() {
		iterations = 100
	}
	for it := range iterations {
		r := rand.New(rand.NewPCG(seed, uint64(it)))
		bulk := it%200 == 199
		cfg := randomConfig(r, bulk)
		b, err := NewBuffer(cfg)
		require.NoError(t, err, "%+v", cfg)
		mr := &modelRun{t: t, r: r, b: b, md: newBufModel(cfg), bulk: 6}
		if bulk {
			mr.bulk = 300
		}
		start := r.Int64N(3) * 1000
		b.Reset(start)
		mr.md.reset(start)
		mr.logf("iteration %d: Reset(%d)", it, start)
		for range steps {
			mr.step()
		}
		if mr.wait != nil { // release the waiting Put
			b.Close()
			mr.md.closed = true
			mr.wake()
		}
	}
}
