package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/filestore"
)

// storeEnv names the environment variable that --store defaults to.
const storeEnv = "FERRY_STORE"

// location is where a store lives, parsed from --store: a directory
// (DIR or file:///DIR). The scheme leaves room for stores reached over
// the network (nats://...), which would get their own opener here.
type location struct {
	Scheme string // "file"
	Path   string // for file: the directory
	Raw    string
}

// parseLocation parses the value of --store.
func parseLocation(s string) (location, error) {
	if s == "" {
		return location{}, usageErrorf("no store: give --store DIR (or file:///DIR), or set %s", storeEnv)
	}
	i := strings.Index(s, "://")
	if i < 0 {
		return location{Scheme: "file", Path: s, Raw: s}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return location{}, usageErrorf("bad --store %q: %v", s, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return location{}, usageErrorf("bad --store %q: a file URL names a local directory (file:///DIR), not host %q", s, u.Host)
		}
		if u.Path == "" {
			return location{}, usageErrorf("bad --store %q: no directory", s)
		}
		return location{Scheme: "file", Path: u.Path, Raw: s}, nil
	default:
		return location{}, usageErrorf("unsupported store scheme %q in --store %q: this ferry reads file stores only (DIR or file:///DIR)", u.Scheme, s)
	}
}

// readStore is what the inspection commands read: topics and queues,
// and the groups' cursors. A [*filestore.ReadOnlyStore] is one; a store
// reached over the network would be another.
type readStore interface {
	ferry.Storage
	ferry.SharedStorage
	ferry.CursorStore
	ferry.CursorGroups
}

// segmentLister is what a file store adds: its files.
type segmentLister interface {
	Segments(ctx context.Context, topic string, queue int) ([]filestore.SegmentInfo, error)
}

// queueDamage returns the damage in the files of queue i of meta, as the
// owner's Open would find it (the first damaged segment's error, which
// wraps [ferry.ErrCorrupt] and names the file and byte), or nil. Figures
// read from a damaged queue stop at the damage: a command shows this
// instead. A store without files shows none.
func queueDamage(ctx context.Context, st readStore, meta ferry.TopicMeta, i int) error {
	sl, ok := st.(segmentLister)
	if !ok {
		return nil
	}
	segs, err := sl.Segments(ctx, meta.Name, i)
	if err != nil {
		return err
	}
	return segmentDamage(ferry.QueueID{Topic: meta.Name, Queue: i}, segs)
}

// segmentDamage returns the damage of the first damaged one of the
// segments of queue id, or nil.
func segmentDamage(id ferry.QueueID, segs []filestore.SegmentInfo) error {
	for _, s := range segs {
		if s.Damage {
			return fmt.Errorf("%s: %w", id, s.TailErr)
		}
	}
	return nil
}

// openRead opens the store at loc for reading, without its lock.
func openRead(loc location) (readStore, error) {
	st, err := filestore.OpenReadOnly(loc.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no store in %s (no such directory, or not a ferry store)", loc.Path)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// openWrite opens the store at loc as its owner, creating it when
// create is set; another process holding it is a clear error.
func openWrite(loc location, create bool) (*filestore.Store, error) {
	if !create {
		if _, err := os.Stat(loc.Path); err != nil {
			return nil, fmt.Errorf("no store in %s: %w", loc.Path, err)
		}
	}
	st, err := filestore.Open(loc.Path)
	if errors.Is(err, filestore.ErrLocked) {
		return nil, fmt.Errorf("store %s is locked: another process has it open; stop it first (the read-only commands topics, lag, cat, tail, stat and verify work meanwhile)", loc.Path)
	}
	return st, err
}

// topicMeta returns topic's metadata, with a clear error when missing.
func topicMeta(ctx context.Context, st ferry.SharedStorage, topic string) (ferry.TopicMeta, error) {
	meta, err := st.Topic(ctx, topic)
	if errors.Is(err, ferry.ErrTopicNotFound) {
		return meta, fmt.Errorf("no topic %q in the store", topic)
	}
	return meta, err
}
