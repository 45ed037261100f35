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

// EnhancedMessage is a Message plus what the producer stamps (ID, BornTime,
// BornAddress, Producer) and what the store assigns (Queue, Offset,
// StoreTime). It is immutable once written: queues hand every reader the
// same pointer, so nobody may modify a stored EnhancedMessage.
type EnhancedMessage struct {
	Message
	// ID is unique and roughly sortable by time; see [MessageID].
	ID MessageID
	// BornTime is when the producer stamped the message. While a broker's
	// producers send more than about 64,000 messages a second, they stamp
	// them with a reading of the clock the broker refreshes every
	// millisecond instead of reading the clock per message: BornTime then
	// has millisecond resolution and can lag the wall clock by a
	// millisecond, more when the machine is saturated.
	BornTime time.Time
	// BornAddress names the host that produced the message.
	BornAddress string
	// Producer is the producer's name (see WithProducerName).
	Producer string

	// Queue is the queue index within Topic the message was written to.
	Queue int
	// Offset is the message's position in its queue.
	Offset int64
	// StoreTime is when the queue stored the message. A memory queue
	// written by a Producer takes the producer's stamp (BornTime) unless
	// the write had to wait for room.
	StoreTime time.Time
}

// QueueID returns the queue the message was written to.
func (m *EnhancedMessage) QueueID() QueueID { return QueueID{Topic: m.Topic, Queue: m.Queue} }

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
	processTag  [4]byte
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
	binary.BigEndian.PutUint32(processTag[:], h.Sum32())
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
	ms := uint64(now.UnixMilli())
	id[0] = byte(ms >> 40)
	id[1] = byte(ms >> 32)
	id[2] = byte(ms >> 24)
	id[3] = byte(ms >> 16)
	id[4] = byte(ms >> 8)
	id[5] = byte(ms)
	copy(id[6:10], processTag[:])
	id[10] = byte(c >> 40)
	id[11] = byte(c >> 32)
	id[12] = byte(c >> 24)
	id[13] = byte(c >> 16)
	id[14] = byte(c >> 8)
	id[15] = byte(c)
	return id
}

// BornAddress returns the address producers of this process stamp on
// messages: the host name, or an IP when the host name is unknown.
func BornAddress() string { return bornAddress }
