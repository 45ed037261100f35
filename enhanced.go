package ferry

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// EnhancedMessage is a Message plus what the producer stamps (ID, the
// born time, the [Origin]) and what the store assigns (Queue, Offset, the
// store time). It is immutable once written: queues hand every reader the
// same pointer, so nobody may modify a stored EnhancedMessage.
//
// Every message a queue keeps is one of these, so its size is the
// library's memory and GC cost per message: times are Unix nanoseconds
// (read them as [time.Time] with [EnhancedMessage.BornTime] and
// [EnhancedMessage.StoreTime]) and the producer's name and host are one
// shared pointer, which keeps it at 160 bytes and seven pointer words.
type EnhancedMessage struct {
	Message
	// ID is unique and roughly sortable by time; see [MessageID].
	ID MessageID
	// BornUnixNano is when the producer stamped the message, in Unix
	// nanoseconds; zero: unknown. While a broker's producers send more
	// than about 64,000 messages a second, they stamp them with a reading
	// of the clock the broker refreshes every millisecond instead of
	// reading the clock per message: the stamp then has millisecond
	// resolution and can lag the wall clock by a millisecond, more when
	// the machine is saturated.
	BornUnixNano int64
	// Origin names the producer and its host. Every message of one
	// producer shares it: never modify it. Nil: unknown.
	Origin *Origin

	// Queue is the queue index within Topic the message was written to.
	Queue int
	// Offset is the message's position in its queue.
	Offset int64
	// StoreUnixNano is when the queue stored the message, in Unix
	// nanoseconds; zero: unknown. A memory queue written by a Producer
	// takes the producer's stamp (BornUnixNano) unless the write had to
	// wait for room.
	StoreUnixNano int64
}

// Origin is where messages come from: a producer and its host. A
// producer stamps one Origin on all its messages.
type Origin struct {
	// Producer is the producer's name (see [WithProducerName]).
	Producer string
	// Host names the host that produced the messages (see [Hostname]).
	Host string
}

// QueueID returns the queue the message was written to.
func (m *EnhancedMessage) QueueID() QueueID { return QueueID{Topic: m.Topic, Queue: m.Queue} }

// BornTime returns when the producer stamped the message (see
// BornUnixNano), or the zero time if unknown.
func (m *EnhancedMessage) BornTime() time.Time { return unixTime(m.BornUnixNano) }

// StoreTime returns when the queue stored the message (see StoreUnixNano),
// or the zero time if unknown.
func (m *EnhancedMessage) StoreTime() time.Time { return unixTime(m.StoreUnixNano) }

// ProducerName returns the name of the producer that sent the message
// (see [WithProducerName]), "" if unknown.
func (m *EnhancedMessage) ProducerName() string {
	if m.Origin == nil {
		return ""
	}
	return m.Origin.Producer
}

// BornHost returns the host that produced the message (its producer's
// [Hostname]), "" if unknown.
func (m *EnhancedMessage) BornHost() string {
	if m.Origin == nil {
		return ""
	}
	return m.Origin.Host
}

// unixTime is time.Unix(0, ns), or the zero time for 0.
func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// MessageID identifies a message: 6 bytes of Unix milliseconds (big endian,
// so IDs sort roughly by time), 4 bytes naming the process (a hash of host
// name, pid and random bits: RocketMQ's address+pid idea) and 6 bytes of a
// per-process counter. Making one takes an atomic add, no lock and no
// allocation.
type MessageID [16]byte

// String returns the ID as 32 lowercase hex digits.
func (id MessageID) String() string { return hex.EncodeToString(id[:]) }

// MarshalText implements encoding.TextMarshaler.
func (id MessageID) MarshalText() ([]byte, error) {
	b := make([]byte, 32)
	hex.Encode(b, id[:])
	return b, nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *MessageID) UnmarshalText(b []byte) error {
	if len(b) != 32 {
		return fmt.Errorf("%w: message id of %d characters, want 32", ErrInvalidMessage, len(b))
	}
	if _, err := hex.Decode(id[:], b); err != nil {
		return fmt.Errorf("%w: message id: %v", ErrInvalidMessage, err)
	}
	return nil
}

// Time returns the millisecond timestamp embedded in the ID.
func (id MessageID) Time() time.Time {
	var b [8]byte
	copy(b[2:], id[:6])
	return time.UnixMilli(int64(binary.BigEndian.Uint64(b[:])))
}

// IsZero reports whether id is the zero ID.
func (id MessageID) IsZero() bool { return id == MessageID{} }

var (
	// processTag names the process in IDs (bytes 6-9), as two halves.
	processTag  [2]uint16
	bornAddress string
)

// idCounter counts the IDs made in the process. It has a cache line of its
// own: every producer adds to it, and nothing else should pay for that.
var idCounter struct {
	_ [64]byte
	atomic.Uint64
	_ [56]byte
}

func init() {
	host, _ := os.Hostname()
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	h := fnv.New32a()
	_, _ = h.Write([]byte(host))
	_ = binary.Write(h, binary.BigEndian, int32(os.Getpid()))
	_, _ = h.Write(seed[:4])
	tag := h.Sum32()
	processTag = [2]uint16{uint16(tag >> 16), uint16(tag)}
	idCounter.Store(binary.BigEndian.Uint64(seed[:]) >> 16)
	bornAddress = localAddress(host)
}

// localAddress returns the host name, or the first non-loopback IP when the
// host name is unknown.
func localAddress(host string) string {
	if host != "" {
		return host
	}
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() {
				return ipn.IP.String()
			}
		}
	}
	return "localhost"
}

// NewMessageID returns a new unique ID stamped with now.
func NewMessageID(now time.Time) MessageID { return messageID(now, reserveIDs(1)) }

// reserveIDs reserves n consecutive ID counter values and returns the
// first: one atomic add for a whole batch.
func reserveIDs(n int) uint64 { return idCounter.Add(uint64(n)) - uint64(n) + 1 }

// messageID returns the ID stamped with now and counter value c.
func messageID(now time.Time, c uint64) MessageID {
	var id MessageID
	binary.BigEndian.PutUint64(id[:8], uint64(now.UnixMilli())<<16|uint64(processTag[0]))
	binary.BigEndian.PutUint64(id[8:], uint64(processTag[1])<<48|c&(1<<48-1))
	return id
}

// Hostname returns the host name the producers of this process stamp on
// their messages (as [Origin].Host, read with [EnhancedMessage.BornHost]):
// [os.Hostname], or the first non-loopback IP address when that is
// unknown, or "localhost".
func Hostname() string { return bornAddress }
