package remote

import (
	"context"
	"fmt"

	"github.com/ferrymq/ferry"
)

// The cursor calls, served where the server's storage is also a
// [ferry.CursorStore] (filestore's is, with [ferry.CursorGroups] and
// [ferry.FencedCursorStore]).
const (
	mLoad         = "Load"
	mCommit       = "Commit"
	mCursors      = "Cursors"
	mForget       = "Forget"
	mCommitFenced = "CommitFenced"
)

// cursorRequest is the body of every cursor call; each uses what it needs.
type cursorRequest struct {
	Topic  string `json:"topic"`
	Group  string `json:"group,omitempty"`
	Queues int    `json:"queues,omitempty"` // Load, Cursors
	Queue  int    `json:"queue,omitempty"`  // Commit, CommitFenced
	Offset int64  `json:"offset,omitempty"` // Commit, CommitFenced
	Token  uint64 `json:"token,omitempty"`  // CommitFenced
}

var (
	_ ferry.CursorStore       = (*Storage)(nil)
	_ ferry.CursorGroups      = (*Storage)(nil)
	_ ferry.FencedCursorStore = (*Storage)(nil)
)

// Load returns group's cursor on topic from the server's cursor store
// (see [ferry.CursorStore]).
func (s *Storage) Load(ctx context.Context, topic, group string, queues int) ([]int64, error) {
	var offs []int64
	err := s.control(ctx, s.ctx, fmt.Sprintf("load cursor %s of %s", group, topic), mLoad, nil, cursorRequest{Topic: topic, Group: group, Queues: queues}, &offs)
	if err != nil {
		return nil, err
	}
	if len(offs) != queues {
		return nil, &ferry.Error{Op: fmt.Sprintf("remote load cursor %s of %s", group, topic), Err: fmt.Errorf("%w: %d offsets for %d queues", ferry.ErrCorrupt, len(offs), queues)}
	}
	return offs, nil
}

// Commit records offset as group's next offset on queue of topic, on the
// server (see [ferry.CursorStore]).
func (s *Storage) Commit(ctx context.Context, topic, group string, queue int, offset int64) error {
	return s.control(ctx, s.ctx, fmt.Sprintf("commit %s of %s[%d]", group, topic, queue), mCommit, nil, cursorRequest{Topic: topic, Group: group, Queue: queue, Offset: offset}, nil)
}

// CommitFenced is Commit under a lease's fencing token (see
// [ferry.FencedCursorStore]); a stale token is [ferry.ErrFenced].
func (s *Storage) CommitFenced(ctx context.Context, topic, group string, queue int, offset int64, token uint64) error {
	return s.control(ctx, s.ctx, fmt.Sprintf("commit %s of %s[%d]", group, topic, queue), mCommitFenced, nil, cursorRequest{Topic: topic, Group: group, Queue: queue, Offset: offset, Token: token}, nil)
}

// Cursors returns every group's cursor on topic (see [ferry.CursorGroups]).
func (s *Storage) Cursors(ctx context.Context, topic string, queues int) (ferry.Cursors, error) {
	var c ferry.Cursors
	err := s.control(ctx, s.ctx, "cursors of "+topic, mCursors, nil, cursorRequest{Topic: topic, Queues: queues}, &c)
	if err != nil {
		return ferry.Cursors{}, err
	}
	if c.Groups == nil {
		c.Groups = map[string]ferry.Cursor{}
	}
	return c, nil
}

// Forget deletes group's cursors on topic (see [ferry.CursorGroups]).
func (s *Storage) Forget(ctx context.Context, topic, group string) error {
	return s.control(ctx, s.ctx, fmt.Sprintf("forget %s of %s", group, topic), mForget, nil, cursorRequest{Topic: topic, Group: group}, nil)
}

// cursor serves the cursor calls.
func (s *Server) cursor(ctx context.Context, method string, body []byte) (any, error) {
	var req cursorRequest
	if err := unmarshal(body, &req); err != nil {
		return nil, err
	}
	cs, ok := s.st.(ferry.CursorStore)
	if !ok {
		return nil, fmt.Errorf("%w: remote: storage %T keeps no cursors", ferry.ErrInvalidOption, s.st)
	}
	cg, _ := s.st.(ferry.CursorGroups)
	fc, _ := s.st.(ferry.FencedCursorStore)
	switch {
	case method == mLoad:
		return cs.Load(ctx, req.Topic, req.Group, req.Queues)
	case method == mCommit:
		return struct{}{}, cs.Commit(ctx, req.Topic, req.Group, req.Queue, req.Offset)
	case method == mCommitFenced && fc != nil:
		return struct{}{}, fc.CommitFenced(ctx, req.Topic, req.Group, req.Queue, req.Offset, req.Token)
	case method == mCursors && cg != nil:
		return cg.Cursors(ctx, req.Topic, req.Queues)
	case method == mForget && cg != nil:
		return struct{}{}, cg.Forget(ctx, req.Topic, req.Group)
	}
	return nil, fmt.Errorf("%w: remote: storage %T cannot %s", ferry.ErrInvalidOption, s.st, method)
}
