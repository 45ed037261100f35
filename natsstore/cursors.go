package natsstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ferrymq/ferry"
	"github.com/nats-io/nats.go/jetstream"
)

// Cursors live in the bucket "<prefix>_cursors", one key per (topic,
// group, queue): "<encoded topic>.<encoded group>.<queue>", whose value
// holds the offset and the fencing token of the last fenced commit. Every
// commit is a compare-and-set on the key's revision.

func cursorKey(topic, group string, q int) string {
	return encodeToken(topic) + "." + encodeToken(group) + "." + strconv.Itoa(q)
}

// cursorValue is 16 bytes: offset, token (big endian).
func encodeCursor(offset int64, token uint64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, uint64(offset))
	binary.BigEndian.PutUint64(b[8:], token)
	return b
}

func decodeCursor(b []byte) (offset int64, token uint64, err error) {
	if len(b) != 16 {
		return 0, 0, fmt.Errorf("%w: cursor value of %d bytes", ferry.ErrCorrupt, len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), binary.BigEndian.Uint64(b[8:]), nil
}

// parseCursorKey splits a key into group and queue.
func parseCursorKey(key string) (group string, q int, ok bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return "", 0, false
	}
	group, ok = decodeToken(parts[1])
	q, err := strconv.Atoi(parts[2])
	return group, q, ok && err == nil
}

// Load implements [ferry.CursorStore]: one watch of the group's keys.
func (s *Store) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	if err := checkContext(ctx); err != nil {
		return nil, &ferry.Error{Op: "natsstore: load cursor", Err: err}
	}
	if err := ferry.ValidateGroupCursorArgs(topic, group, queues); err != nil {
		return nil, &ferry.Error{Op: "natsstore: load cursor", Err: err}
	}
	if s.isClosed() {
		return nil, &ferry.Error{Op: "natsstore: load cursor", Err: ferry.ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return nil, &ferry.Error{Op: "natsstore: load cursor", Err: err}
	}
	out := make([]int64, queues)
	for i := range out {
		out[i] = -1
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	es, err := liveEntries(ctx, s.js, s.cursors, encodeToken(topic)+"."+encodeToken(group)+".*")
	for _, e := range es {
		_, q, ok := parseCursorKey(e.Key())
		if !ok || q >= queues {
			continue
		}
		if out[q], _, err = decodeCursor(e.Value()); err != nil {
			break
		}
	}
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: load cursor %s/%s", topic, group), Err: err}
	}
	return out, nil
}

// Commit implements [ferry.CursorStore]; it keeps the key's token.
func (s *Store) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "natsstore: commit cursor", Err: err}
	}
	return s.commit(ctx, topic, group, queue, offset, 0, false)
}

// CommitFenced implements [ferry.FencedCursorStore]: a compare-and-set
// that refuses, writing nothing, when the stored token is higher than
// token. Tokens live in the bucket, so they outlive every process.
func (s *Store) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "natsstore: commit cursor", Err: err}
	}
	return s.commit(ctx, topic, group, queue, offset, token, true)
}

func (s *Store) commit(ctx context.Context, topic, group string, queue int, offset int64, token uint64, fenced bool) error {
	if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil {
		return &ferry.Error{Op: "natsstore: commit cursor", Err: err}
	}
	if offset < 0 {
		return &ferry.Error{Op: "natsstore: commit cursor", Err: fmt.Errorf("%w: offset %d", ferry.ErrOffsetOutOfRange, offset)}
	}
	if s.isClosed() {
		return &ferry.Error{Op: "natsstore: commit cursor", Err: ferry.ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return &ferry.Error{Op: "natsstore: commit cursor", Err: err}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	key := cursorKey(topic, group, queue)
	for {
		e, err := s.cursors.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			tok := uint64(0)
			if fenced {
				tok = token
			}
			_, err = s.cursors.Create(ctx, key, encodeCursor(offset, tok))
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // raced another commit: read again
			}
			if err != nil {
				return &ferry.Error{Op: fmt.Sprintf("natsstore: commit cursor %s/%s[%d]", topic, group, queue), Err: err}
			}
			return nil
		}
		if err != nil {
			return &ferry.Error{Op: fmt.Sprintf("natsstore: commit cursor %s/%s[%d]", topic, group, queue), Err: err}
		}
		_, last, err := decodeCursor(e.Value())
		if err != nil {
			return &ferry.Error{Op: fmt.Sprintf("natsstore: commit cursor %s/%s[%d]", topic, group, queue), Err: err}
		}
		tok := last
		if fenced {
			if token < last {
				return &ferry.Error{Op: fmt.Sprintf("natsstore: commit cursor %s/%s[%d]", topic, group, queue), Err: fmt.Errorf("%w: token %d, last %d", ferry.ErrFenced, token, last)}
			}
			tok = token
		}
		_, err = s.cursors.Update(ctx, key, encodeCursor(offset, tok), e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return &ferry.Error{Op: fmt.Sprintf("natsstore: commit cursor %s/%s[%d]", topic, group, queue), Err: err}
		}
		return nil
	}
}

// Cursors implements [ferry.CursorGroups]: one watch of the topic's keys.
func (s *Store) Cursors(ctx context.Context, topic string, queues int) (ferry.Cursors, error) {
	if err := checkContext(ctx); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "natsstore: list cursors", Err: err}
	}
	if err := ferry.ValidateTopicCursorsArgs(topic, queues); err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: "natsstore: list cursors", Err: err}
	}
	if s.isClosed() {
		return ferry.Cursors{}, &ferry.Error{Op: "natsstore: list cursors", Err: ferry.ErrClosed}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	out := ferry.Cursors{Topic: topic, Groups: map[string]ferry.Cursor{}}
	es, err := liveEntries(ctx, s.js, s.cursors, encodeToken(topic)+".*.*")
	for _, e := range es {
		if err != nil {
			break
		}
		err = addCursor(out, e, queues)
	}
	if err != nil {
		return ferry.Cursors{}, &ferry.Error{Op: fmt.Sprintf("natsstore: list cursors of %s", topic), Err: err}
	}
	return out, nil
}

// addCursor adds the cursor entry e to out.
func addCursor(out ferry.Cursors, e jetstream.KeyValueEntry, queues int) error {
	group, q, ok := parseCursorKey(e.Key())
	if !ok {
		return nil
	}
	c, have := out.Groups[group]
	if !have {
		c = ferry.Cursor{Group: group, Offsets: make([]int64, queues)}
		for i := range c.Offsets {
			c.Offsets[i] = -1
		}
		out.Groups[group] = c
	}
	if q < queues {
		off, _, err := decodeCursor(e.Value())
		if err != nil {
			return err
		}
		c.Offsets[q] = off
	}
	return nil
}

// Forget implements [ferry.CursorGroups]: it purges the group's keys of
// the topic, tokens included.
func (s *Store) Forget(ctx context.Context, topic, group string) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "natsstore: forget cursor", Err: err}
	}
	if err := ferry.ValidateGroupCursorArgs(topic, group, 0); err != nil {
		return &ferry.Error{Op: "natsstore: forget cursor", Err: err}
	}
	if s.isClosed() {
		return &ferry.Error{Op: "natsstore: forget cursor", Err: ferry.ErrClosed}
	}
	ctx, cancel := s.cfg.bound(ctx)
	defer cancel()
	es, err := liveEntries(ctx, s.js, s.cursors, encodeToken(topic)+"."+encodeToken(group)+".*")
	for _, e := range es {
		if err != nil {
			break
		}
		err = s.cursors.Purge(ctx, e.Key())
	}
	if err != nil {
		return &ferry.Error{Op: fmt.Sprintf("natsstore: forget cursor %s/%s", topic, group), Err: err}
	}
	return nil
}
