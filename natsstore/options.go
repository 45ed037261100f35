package natsstore

import (
	"fmt"
	"regexp"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/nats-io/nats.go/jetstream"
)

// Option configures a [Store] or a [Coordinator]. Options never fail; the
// constructor checks the values and returns [ferry.ErrInvalidOption].
type Option func(*config)

type config struct {
	prefix         string
	replicas       int
	storage        jetstream.StorageType
	opTimeout      time.Duration
	ttl            time.Duration
	safety         float64
	recordOverhead int64
	dupWindow      time.Duration
}

// Defaults of the options.
const (
	DefaultPrefix         = "ferry"
	DefaultReplicas       = 1
	DefaultOpTimeout      = 2 * time.Second
	DefaultTTL            = 15 * time.Second
	DefaultSafety         = 0.8
	DefaultRecordOverhead = 512
	DefaultDupWindow      = 2 * time.Minute
)

func defaults() config {
	return config{
		prefix:         DefaultPrefix,
		replicas:       DefaultReplicas,
		storage:        jetstream.FileStorage,
		opTimeout:      DefaultOpTimeout,
		ttl:            DefaultTTL,
		safety:         DefaultSafety,
		recordOverhead: DefaultRecordOverhead,
		dupWindow:      DefaultDupWindow,
	}
}

// WithPrefix names every stream, bucket and subject this package makes
// with prefix, so that several deployments share one NATS account. 1 to
// 32 bytes of [A-Za-z0-9-]. Default "ferry".
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithReplicas sets the replica count of every stream and bucket created:
// 1 or 3 (or 5). Default 1. Existing streams and buckets keep theirs.
func WithReplicas(n int) Option { return func(c *config) { c.replicas = n } }

// WithMemoryStorage keeps streams and buckets in the servers' memory
// instead of on their disks (file storage, the default): faster, and lost
// when every replica restarts.
func WithMemoryStorage() Option { return func(c *config) { c.storage = jetstream.MemoryStorage } }

// WithOpTimeout bounds each request to NATS made by a call without a
// context (Offsets, Release, TryWrite) or under a context without a
// deadline, and each try of a write: a write whose try times out (its
// stream's leader died, say) tries again, with the same message IDs,
// until its context ends. Default 2 s.
func WithOpTimeout(d time.Duration) Option { return func(c *config) { c.opTimeout = d } }

// WithTTL sets the coordinator's time to live: a member or lock holder
// silent this long is gone. It must outlast a leader election of the
// buckets' Raft groups on R3 (elections took 4–9 s when a leader's
// process was killed), hence the default, 15 s. At least 1 s.
func WithTTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// WithSafety sets the fraction of the TTL after the start of its last
// successful renewal at which a lease (and a session) counts itself lost,
// before the server can expire its key: in (0, 1), default 0.8.
func WithSafety(f float64) Option { return func(c *config) { c.safety = f } }

// WithRecordOverhead sets the bytes per message a queue's stream is given
// beyond [ferry.Retention].MaxBytes: JetStream counts the subject, the
// headers and the encoded message, where Ferry counts [ferry.Message.Size]
// (body, key, tag, headers). A stream's byte bound is MaxBytes +
// overhead × MaxMessages. Default 512; at least 0.
func WithRecordOverhead(n int64) Option { return func(c *config) { c.recordOverhead = n } }

// WithDuplicateWindow sets how long the stream of a topic with
// [ferry.DedupOff] remembers message IDs to drop a retried write (capped
// by the topic's MaxAge). Default 2 min. Any other topic's stream
// remembers them, and its messages' dedup keys, over the topic's
// [ferry.TopicMeta].DedupWindow.
func WithDuplicateWindow(d time.Duration) Option { return func(c *config) { c.dupWindow = d } }

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9-]{1,32}$`)

func newConfig(opts []Option) (config, error) {
	c := defaults()
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	switch {
	case !prefixRE.MatchString(c.prefix):
		return c, fmt.Errorf("%w: prefix %q: want 1 to 32 bytes of [A-Za-z0-9-]", ferry.ErrInvalidOption, c.prefix)
	case c.replicas != 1 && c.replicas != 3 && c.replicas != 5:
		return c, fmt.Errorf("%w: %d replicas: want 1, 3 or 5", ferry.ErrInvalidOption, c.replicas)
	case c.opTimeout <= 0:
		return c, fmt.Errorf("%w: op timeout %v", ferry.ErrInvalidOption, c.opTimeout)
	case c.ttl < time.Second:
		return c, fmt.Errorf("%w: TTL %v below 1s", ferry.ErrInvalidOption, c.ttl)
	case !(c.safety > 0 && c.safety < 1):
		return c, fmt.Errorf("%w: safety %v not in (0, 1)", ferry.ErrInvalidOption, c.safety)
	case c.recordOverhead < 0:
		return c, fmt.Errorf("%w: record overhead %d", ferry.ErrInvalidOption, c.recordOverhead)
	case c.dupWindow <= 0:
		return c, fmt.Errorf("%w: duplicate window %v", ferry.ErrInvalidOption, c.dupWindow)
	}
	return c, nil
}
