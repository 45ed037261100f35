package filestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferry"
)

// deletedPrefix starts the name a deleted topic's directory is renamed to
// before its files go: not a valid topic name, so Open never loads it, and
// removes what a crash left of it.
const deletedPrefix = "~deleted-"

// DeleteTopic implements [ferry.TopicDeleter]: it closes the topic's open
// queues, forgets its metadata and removes its files. The topic's
// directory is first renamed out of the way (and the rename synced), so a
// crash leaves either the whole topic or none of it; Open removes what a
// crash left of a deletion. Deleting a topic the store does not hold does
// nothing. Cursors stay (see [Store.Forget]).
func (st *Store) DeleteTopic(ctx context.Context, name string) error {
	if err := checkContext(ctx); err != nil {
		return &ferry.Error{Op: "filestore: delete topic", Err: err}
	}
	if err := ferry.ValidateTopicName(name); err != nil {
		return &ferry.Error{Op: "filestore: delete topic", Err: err}
	}
	if err := ctx.Err(); err != nil {
		return &ferry.Error{Op: "filestore: delete topic", Err: err}
	}
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return &ferry.Error{Op: "filestore: delete topic", Err: ferry.ErrClosed}
	}
	var open []*queue
	for id, q := range st.queues {
		if id.Topic == name {
			open = append(open, q)
			delete(st.queues, id)
		}
	}
	delete(st.topics, name)
	st.mu.Unlock()
	for _, q := range open {
		_ = q.Close()
	}
	tdir := path.Join("topics", name)
	if _, err := fs.Stat(st.root.FS(), tdir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	trash := path.Join("topics", deletedPrefix+name+"-"+strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := st.files.rename(tdir, trash); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("filestore: delete topic %q", name), Err: err}
	}
	if err := st.files.syncDir("topics"); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("filestore: delete topic %q", name), Err: err}
	}
	if err := st.root.RemoveAll(trash); err != nil {
		return &ferry.Error{Op: fmt.Sprintf("filestore: delete topic %q", name), Err: err}
	}
	return nil
}

// removeDeleted removes what a crash left of topic deletions.
func (st *Store) removeDeleted() error {
	entries, err := fs.ReadDir(st.root.FS(), "topics")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), deletedPrefix) {
			if err := st.root.RemoveAll(path.Join("topics", e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

var _ ferry.TopicDeleter = (*Store)(nil)
