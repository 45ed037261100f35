package natsstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// encodeToken encodes s as one token of a NATS subject, KV key or stream
// name: [A-Za-z0-9_-] stay, every other byte (".", "%", "=", "@" ...)
// becomes "=XX". The encoding is injective, so names never collide.
func encodeToken(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			b.WriteByte(c)
		default:
			const hexd = "0123456789ABCDEF"
			b.WriteByte('=')
			b.WriteByte(hexd[c>>4])
			b.WriteByte(hexd[c&15])
		}
	}
	return b.String()
}

// decodeToken reverses encodeToken.
func decodeToken(s string) (string, bool) {
	if !strings.Contains(s, "=") {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '=' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), true
}

// maxStreamName is the longest stream name this package makes: below
// JetStream's 255, leaving room in file names and API subjects.
const maxStreamName = 200

// streamName names the stream of queue q of topic:
// "<prefix>_<encoded topic>_<q>". A name that would be too long keeps a
// readable head of the topic and a SHA-256 of the whole.
func streamName(prefix, topic string, q int) string {
	enc := encodeToken(topic)
	tail := "_" + strconv.Itoa(q)
	if len(prefix)+1+len(enc)+len(tail) > maxStreamName {
		sum := sha256.Sum256([]byte(topic))
		h := "~" + hex.EncodeToString(sum[:16])
		keep := maxStreamName - len(prefix) - 1 - len(tail) - len(h)
		head := enc[:keep]
		// Do not cut an escape in half.
		if i := strings.LastIndexByte(head, '='); i >= 0 && i > len(head)-3 {
			head = head[:i]
		}
		enc = head + h
	}
	return prefix + "_" + enc + tail
}
