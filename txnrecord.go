package ferry

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// A transaction record's body: a version byte (1), the count of outputs,
// then each output: its topic, queue, the topic's incarnation when it was
// sent (see TopicMeta.Incarnation: an output for a topic created again
// since is dropped), its due time (Unix ns; 0: now), then the message:
// key, tag, deduplication key (the sender's; empty: one is derived from
// the record's position), ID, born time, origin (producer, host),
// headers and body. Strings and the body are a uvarint length and the
// bytes; numbers varints.

const txnRecordVersion = 1

// txnWrittenVersion is the whole body of a record whose outputs were
// written with it, in one atomic write (a log in memory, see
// txnLog.commitMemory): a next owner has none of them to write again.
const txnWrittenVersion = 2

// txnWrittenBody is the body of every such record of one input (never
// modified).
var txnWrittenBody = []byte{txnWrittenVersion}

// txnWrittenManyVersion begins the body of a record, written with its
// outputs as txnWrittenVersion's are, of the calls of several inputs
// (a worker's batch, see txnStage): the count of inputs after the first
// (whose offset the tag has), then each one's offset as a uvarint step
// up from the one before.
const txnWrittenManyVersion = 3

// encodeWrittenInputs returns the body of a record written with its
// outputs for the inputs offs (ascending; offs[0] is the tag's).
func encodeWrittenInputs(offs []int64) []byte {
	if len(offs) == 1 {
		return txnWrittenBody
	}
	b := make([]byte, 0, 1+binary.MaxVarintLen64+2*len(offs))
	b = append(b, txnWrittenManyVersion)
	b = binary.AppendUvarint(b, uint64(len(offs)-1))
	for i := 1; i < len(offs); i++ {
		b = binary.AppendUvarint(b, uint64(offs[i]-offs[i-1]))
	}
	return b
}

// recordInputs returns the input offsets of a record whose tag says off:
// off alone, unless its body lists more (txnWrittenManyVersion). A list
// that breaks the format is ErrCorrupt.
func recordInputs(off int64, body []byte) ([]int64, error) {
	if len(body) == 0 || body[0] != txnWrittenManyVersion {
		return []int64{off}, nil
	}
	r := &txnReader{b: body[1:]}
	n := r.uvarint("input count")
	if n == 0 || n > uint64(len(r.b)) { // every offset takes a byte
		r.fail("input count")
	}
	offs := []int64{off}
	for i := uint64(0); i < n && r.err == nil; i++ {
		step := r.uvarint("input offset")
		if step == 0 || step > math.MaxInt64-uint64(off) {
			r.fail("input offset")
			break
		}
		off += int64(step)
		offs = append(offs, off)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("length")
	}
	if r.err != nil {
		return nil, r.err
	}
	return offs, nil
}

// decodedOutput is an output read back from a record.
type decodedOutput struct {
	topic string
	q     int
	inc   uint64
	at    time.Time
	em    *EnhancedMessage
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeTxnRecord returns the body of the record of outs.
func encodeTxnRecord(outs []txnOutput) []byte {
	n := 2
	for i := range outs {
		em := outs[i].em
		n += 64 + len(outs[i].t.meta.Name) + em.Size()
		if o := em.Origin; o != nil {
			n += len(o.Producer) + len(o.Host)
		}
		n += 2 * len(em.Headers)
	}
	b := make([]byte, 0, n)
	b = append(b, txnRecordVersion)
	b = binary.AppendUvarint(b, uint64(len(outs)))
	for i := range outs {
		o := &outs[i]
		em := o.em
		b = appendString(b, o.t.meta.Name)
		b = binary.AppendUvarint(b, uint64(o.q))
		b = binary.AppendUvarint(b, o.t.meta.Incarnation)
		var at int64
		if !o.at.IsZero() {
			at = o.at.UnixNano()
		}
		b = binary.AppendVarint(b, at)
		b = appendString(b, em.Key)
		b = appendString(b, em.Tag)
		b = appendString(b, em.DedupKey)
		b = append(b, em.ID[:]...)
		b = binary.AppendVarint(b, em.BornUnixNano)
		var prod, host string
		if em.Origin != nil {
			prod, host = em.Origin.Producer, em.Origin.Host
		}
		b = appendString(b, prod)
		b = appendString(b, host)
		b = binary.AppendUvarint(b, uint64(len(em.Headers)))
		for k, v := range em.Headers {
			b = appendString(b, k)
			b = appendString(b, v)
		}
		b = appendString(b, string(em.Body))
	}
	return b
}

// txnReader reads a record's body; its first error sticks.
type txnReader struct {
	b   []byte
	err error
}

func (r *txnReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: transaction record: bad %s", ErrCorrupt, what)
	}
}

func (r *txnReader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *txnReader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *txnReader) bytes(what string) []byte {
	n := r.uvarint(what)
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail(what)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *txnReader) string(what string) string { return string(r.bytes(what)) }

// decodeTxnRecord reads a record's body; a body that breaks the format
// is ErrCorrupt. The messages share nothing with body but their Body.
func decodeTxnRecord(body []byte) ([]decodedOutput, error) {
	if len(body) == 1 && body[0] == txnWrittenVersion || len(body) > 0 && body[0] == txnWrittenManyVersion {
		return nil, nil // written with the record (its inputs: recordInputs)
	}
	if len(body) == 0 || body[0] != txnRecordVersion {
		return nil, fmt.Errorf("%w: transaction record of version %v", ErrCorrupt, body[:min(1, len(body))])
	}
	r := &txnReader{b: body[1:]}
	count := r.uvarint("count")
	if count > uint64(len(r.b)) { // every output takes more than a byte
		r.fail("count")
	}
	var outs []decodedOutput
	for i := uint64(0); i < count && r.err == nil; i++ {
		var o decodedOutput
		o.topic = r.string("topic")
		q := r.uvarint("queue")
		if q >= MaxQueues {
			r.fail("queue")
		}
		o.q = int(q)
		o.inc = r.uvarint("incarnation")
		if at := r.varint("due time"); at != 0 {
			o.at = time.Unix(0, at)
		}
		em := &EnhancedMessage{}
		em.Topic = o.topic
		em.Key = r.string("key")
		em.Tag = r.string("tag")
		em.DedupKey = r.string("dedup key")
		if len(r.b) < len(em.ID) {
			r.fail("id")
			break
		}
		copy(em.ID[:], r.b)
		r.b = r.b[len(em.ID):]
		em.BornUnixNano = r.varint("born time")
		prod, host := r.string("producer"), r.string("host")
		if prod != "" || host != "" {
			em.Origin = &Origin{Producer: prod, Host: host}
		}
		nh := r.uvarint("header count")
		if nh > uint64(len(r.b)) {
			r.fail("header count")
		}
		if nh > 0 && r.err == nil {
			em.Headers = make(map[string]string, nh)
			for j := uint64(0); j < nh && r.err == nil; j++ {
				k := r.string("header")
				em.Headers[k] = r.string("header")
			}
		}
		if body := r.bytes("body"); len(body) > 0 {
			em.Body = body
		}
		o.em = em
		outs = append(outs, o)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("length")
	}
	if r.err != nil {
		return nil, r.err
	}
	return outs, nil
}
