package filestore

import (
	"container/list"
	"errors"
	"os"
	"sync"
)

// fdCache keeps the file descriptors of sealed segments, opened on demand,
// at most max of them unused, closing the least recently used beyond that:
// a store with unlimited retention holds a bounded number of descriptors,
// however many segments it keeps. An active segment keeps its own
// descriptor (segment.f) and is never in the cache. A descriptor in use (a
// read, between acquire and release) is never closed under its reader:
// evicting or dropping it waits for the release.
//
// It is safe for concurrent use.
type fdCache struct {
	root *os.Root
	max  int

	mu  sync.Mutex // guards m and lru
	m   map[*segment]*fdEntry
	lru list.List // of *fdEntry, most recently used first
}

type fdEntry struct {
	s    *segment
	f    *os.File
	refs int           // readers between acquire and release
	gone bool          // dropped or evicted while in use: closed at the last release
	el   *list.Element // in lru; nil once removed
}

func newFDCache(root *os.Root, max int) *fdCache {
	return &fdCache{root: root, max: max, m: map[*segment]*fdEntry{}}
}

// acquire returns the open file of sealed segment s, opening it if
// needed; release it when done.
func (c *fdCache) acquire(s *segment) (*fdEntry, error) {
	c.mu.Lock()
	if e, ok := c.m[s]; ok {
		e.refs++
		c.lru.MoveToFront(e.el)
		c.mu.Unlock()
		return e, nil
	}
	c.mu.Unlock()
	f, err := c.root.Open(s.name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[s]; ok { // opened meanwhile by another reader
		_ = f.Close()
		e.refs++
		c.lru.MoveToFront(e.el)
		return e, nil
	}
	e := &fdEntry{s: s, f: f, refs: 1}
	c.insert(e)
	return e, nil
}

// release ends a use of e begun by acquire.
func (c *fdCache) release(e *fdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	if e.refs == 0 && e.gone {
		_ = e.f.Close()
		return
	}
	c.evict()
}

// put hands the open file f of segment s, just sealed or recovered, to
// the cache.
func (c *fdCache) put(s *segment, f *os.File) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[s]; ok {
		_ = f.Close()
		return
	}
	c.insert(&fdEntry{s: s, f: f})
}

// take removes s from the cache and returns its file, for a segment that
// becomes active again, or nil if it is not cached or in use.
func (c *fdCache) take(s *segment) *os.File {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[s]
	if !ok || e.refs > 0 {
		return nil
	}
	c.remove(e)
	return e.f
}

// drop forgets s, deleted or closed: its file is closed now, or at the
// release of its last reader.
func (c *fdCache) drop(s *segment) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[s]
	if !ok {
		return nil
	}
	c.remove(e)
	if e.refs > 0 {
		e.gone = true
		return nil
	}
	return e.f.Close()
}

// closeAll closes every unused file and forgets them all.
func (c *fdCache) closeAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, e := range c.m {
		c.remove(e)
		if e.refs > 0 {
			e.gone = true
			continue
		}
		errs = append(errs, e.f.Close())
	}
	return errors.Join(errs...)
}

// open returns how many files the cache holds open.
func (c *fdCache) open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func (c *fdCache) insert(e *fdEntry) {
	e.el = c.lru.PushFront(e)
	c.m[e.s] = e
	c.evict()
}

func (c *fdCache) remove(e *fdEntry) {
	c.lru.Remove(e.el)
	e.el = nil
	delete(c.m, e.s)
}

// evict closes the least recently used unused files beyond max.
func (c *fdCache) evict() {
	for el := c.lru.Back(); el != nil && c.lru.Len() > c.max; {
		prev := el.Prev()
		if e := el.Value.(*fdEntry); e.refs == 0 {
			c.remove(e)
			_ = e.f.Close()
		}
		el = prev
	}
}
