package filestore

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ferrymq/ferry"
)

// SyncPolicy says when written bytes are forced to the disk with
// fdatasync: [SyncAlways], [SyncNever] (constants) or [SyncEvery]. The
// zero value is not a policy ([ferry.ErrInvalidOption]).
type SyncPolicy int64

type syncMode int

const (
	syncInvalid syncMode = iota
	syncAlways
	syncEvery
	syncNever
)

const (
	// SyncAlways makes a Write return only after its bytes are on disk
	// (fdatasync). Concurrent writers to a queue share one write and one
	// fdatasync (group commit). Commits to the cursor store likewise return
	// once the cursor file is renamed into place and synced.
	SyncAlways SyncPolicy = -1
	// SyncNever leaves flushing to the operating system: a Write returns
	// once its bytes are in the page cache, so a crash of the process loses
	// no acknowledged write, but a power loss may lose recent writes.
	// Directories are still synced after create, rename and delete. Cursor
	// commits return before the cursor file is written (at once, in the
	// background): a crash may lose the latest.
	SyncNever SyncPolicy = -2
)

// SyncEvery acknowledges writes once they are in the page cache and
// fdatasyncs each queue that has unsynced bytes every d; a power loss may
// lose up to d of acknowledged writes. Cursor commits are written at most
// every d. d must be positive.
func SyncEvery(d time.Duration) SyncPolicy {
	if d <= 0 {
		return 0 // not a policy: Open refuses it
	}
	return SyncPolicy(d)
}

// mode returns the kind of policy.
func (p SyncPolicy) mode() syncMode {
	switch {
	case p == SyncAlways:
		return syncAlways
	case p == SyncNever:
		return syncNever
	case p > 0:
		return syncEvery
	}
	return syncInvalid
}

// interval returns SyncEvery's interval (0 for the others).
func (p SyncPolicy) interval() time.Duration {
	if p > 0 {
		return time.Duration(p)
	}
	return 0
}

// String names the policy.
func (p SyncPolicy) String() string {
	switch p.mode() {
	case syncAlways:
		return "SyncAlways"
	case syncNever:
		return "SyncNever"
	case syncEvery:
		return "SyncEvery(" + p.interval().String() + ")"
	}
	return "SyncPolicy(invalid)"
}

// Option configures [Open].
type Option func(*config)

type config struct {
	sync          SyncPolicy
	segmentBytes  int64
	maxFrameBytes int
	indexInterval int
	cacheMessages int
	cacheBytes    int64
	verify        bool
	repair        bool
	maxOpenSegs   int
	fault         func(op, name string) error // see fsys; set by tests
	log           *slog.Logger
}

// Defaults and limits of the options.
const (
	DefaultSegmentBytes    = 64 << 20 // 64 MiB
	DefaultMaxFrameBytes   = 16 << 20 // 16 MiB
	DefaultCacheMessages   = 4096
	DefaultCacheBytes      = 8 << 20 // 8 MiB
	DefaultMaxOpenSegments = 256

	maxSegmentBytes  = 1 << 30   // offsets in the index are 32-bit
	maxMaxFrameBytes = 256 << 20 // 256 MiB
	minMaxFrameBytes = 4 << 10
)

// WithSync sets the sync policy. Default: [SyncAlways].
func WithSync(p SyncPolicy) Option { return func(c *config) { c.sync = p } }

// WithSegmentBytes sets the size at which a queue starts a new segment
// file. Retention deletes whole segments, and segments also roll at an
// eighth of a topic's retention bounds so that retention stays close to
// them. Default: [DefaultSegmentBytes]; at most 1 GiB, at least 4 KiB.
func WithSegmentBytes(n int64) Option { return func(c *config) { c.segmentBytes = n } }

// WithMaxFrameBytes bounds a frame (one batch of messages on disk); a
// message that does not fit in one frame is [ferry.ErrMessageTooLarge], and
// recovery treats a length field above it as corrupt. Default:
// [DefaultMaxFrameBytes]; between 4 KiB and 256 MiB. Open a directory with
// at least the value it was written with.
func WithMaxFrameBytes(n int) Option { return func(c *config) { c.maxFrameBytes = n } }

// WithCache sets how many of the most recent messages (and at most how many
// bytes of [ferry.Message.Size]) each queue keeps decoded in memory, so a
// consumer that keeps up never reads the disk. Default:
// [DefaultCacheMessages] and [DefaultCacheBytes]; zero disables the cache.
func WithCache(messages int, bytes int64) Option {
	return func(c *config) { c.cacheMessages, c.cacheBytes = messages, bytes }
}

// WithVerify makes Open check the checksum of every frame of every sealed
// segment, not only the newest segment of each queue, so damage anywhere
// is found at Open ([ferry.ErrCorrupt]) rather than when it is read.
// Default: off (Open reads the newest segment and the tail of each older
// one).
func WithVerify() Option { return func(c *config) { c.verify = true } }

// WithRepair lets Open cut damage in the newest segment of a queue that is
// not a torn tail: a bad frame followed by intact ones, which Open
// otherwise refuses with [ferry.ErrCorrupt], cutting nothing. With it, the
// segment is cut at the bad frame, dropping every message after it (the
// intact frames included); the bytes cut are first saved beside the
// segment (%020d.log.corrupt), and [Store.Recovery] lists the cut as a
// [Truncation] with Damaged set and how many messages of intact frames
// were dropped. It is for an operator who has read the error and accepts
// the loss. Damage in an older segment is never cut: it stays
// ErrCorrupt. Default: off.
func WithRepair() Option { return func(c *config) { c.repair = true } }

// WithMaxOpenSegments bounds how many sealed segments, across all the
// store's queues, keep a file descriptor open between reads. Sealed
// segments are opened when read and their descriptors kept in a cache
// that closes the least recently used beyond n, so unlimited retention
// does not mean unlimited descriptors; each open queue also holds one
// for its active segment. Default: [DefaultMaxOpenSegments]; at least 1.
func WithMaxOpenSegments(n int) Option { return func(c *config) { c.maxOpenSegs = n } }

// WithLogger sets where recovery events (a cut torn tail, a rebuilt index,
// a clamped cursor) are logged, besides [Store.Recovery]. Default: discard.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

func newConfig(opts []Option) (config, error) {
	c := config{
		sync:          SyncAlways,
		segmentBytes:  DefaultSegmentBytes,
		maxFrameBytes: DefaultMaxFrameBytes,
		indexInterval: 4096,
		cacheMessages: DefaultCacheMessages,
		cacheBytes:    DefaultCacheBytes,
		maxOpenSegs:   DefaultMaxOpenSegments,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.sync.mode() == syncInvalid:
		return c, fmt.Errorf("%w: sync policy %d (use SyncAlways, SyncNever or SyncEvery with a positive interval)", ferry.ErrInvalidOption, int64(c.sync))
	case c.segmentBytes < 4<<10 || c.segmentBytes > maxSegmentBytes:
		return c, fmt.Errorf("%w: segment bytes %d not in [4 KiB, 1 GiB]", ferry.ErrInvalidOption, c.segmentBytes)
	case c.maxFrameBytes < minMaxFrameBytes || c.maxFrameBytes > maxMaxFrameBytes:
		return c, fmt.Errorf("%w: max frame bytes %d not in [4 KiB, 256 MiB]", ferry.ErrInvalidOption, c.maxFrameBytes)
	case c.maxOpenSegs < 1:
		return c, fmt.Errorf("%w: max open segments %d below 1", ferry.ErrInvalidOption, c.maxOpenSegs)
	case c.cacheMessages < 0 || c.cacheBytes < 0:
		return c, fmt.Errorf("%w: negative cache size", ferry.ErrInvalidOption)
	}
	return c, nil
}
