package filestore

import "fmt"

// The active segment of a queue has disk space reserved ahead of its
// writes with fallocate, in steps that double from minReserve up to the
// segment size. Under SyncNever and SyncEvery, where the platform allows
// (64-bit Linux), it is also written through a shared memory mapping of
// its file: a write is a copy into the page cache, with no system call,
// and survives a crash of the process as a pwrite would. The reservation
// makes that safe: writing back a dirty page can never find the disk
// full, which would raise SIGBUS; a full disk fails the fallocate, and so
// the write, instead. Under SyncAlways, whose fdatasync after every group
// would make the kernel write-protect mapped pages each time (and every
// next write fault), a group is one pwrite into the reserved space, where
// most fdatasyncs then find no new block and no new file size to record.
// Where fallocate is not supported the store writes with pwrite alone.
//
// Readers never see the mapping: they read the file with pread, which
// sees the same page cache. A writer copies a frame into the mapping and
// then publishes the segment's new size under mu, which readers take
// before they read up to that size. Sealing a segment (roll-over, Close)
// unmaps it and cuts the file to its written length, so sealed segments
// are exactly as long as their frames. A file left longer by a crash has
// zeros after its last frame, which recovery cuts like any torn tail.

// useMmap is mmapSupported, turned off by tests of the pwrite path.
var useMmap = mmapSupported

// minReserve is the first step of space reserved in a segment.
const minReserve = 64 << 10

// mapActive maps s, the active segment, for writing, unless the platform
// or the file system does not allow it or s is already at its size bound.
// wmu must be held, or the queue not started.
func (q *queue) mapActive(s *segment) {
	s.alloc = s.size
	n := q.cfg.segmentBytes
	if !useMmap || q.cfg.sync.mode() == syncAlways || q.st.noMmap.Load() || q.st.noReserve.Load() || s.mm != nil || s.size >= n {
		return
	}
	mm, err := q.st.files.mmap(s.f, int(n))
	if err != nil {
		q.st.noMmap.Store(true)
		q.st.cfg.log.Info("ferry: filestore: writing with pwrite", "queue", q.id.String(), "err", err)
		return
	}
	s.mm = mm
}

// activeBuf returns the buffer to build n bytes of frames in, to be
// written at position at of segment s, after reserving space for them:
// the mapping itself (mapped true) when they fit in the reserved part of
// it, and q.out otherwise. wmu must be held.
func (q *queue) activeBuf(s *segment, at, n int64) (buf []byte, mapped bool, err error) {
	end, limit := at+n, q.cfg.segmentBytes
	if end > s.alloc && end <= limit && !q.st.noReserve.Load() {
		r := min(limit, max(end, 2*s.alloc, minReserve))
		err := q.st.files.fallocate(s.f, s.alloc, r-s.alloc)
		switch {
		case err == nil:
			s.alloc = r
		case noReserve(err):
			q.st.noReserve.Store(true)
			q.st.cfg.log.Info("ferry: filestore: writing without reserved space, with pwrite", "queue", q.id.String(), "err", err)
		default:
			return nil, false, err
		}
	}
	if s.mm != nil && end <= s.alloc {
		return s.mm[at:at:end], true, nil
	}
	if s.mm != nil && q.st.noReserve.Load() {
		if err := q.unmap(s); err != nil {
			return nil, false, err
		}
	}
	return q.out[:0], false, nil
}

// writeActive completes the write of the frames built in buf, a buffer
// from activeBuf: a pwrite unless they are in the mapping already. wmu
// must be held.
func (q *queue) writeActive(s *segment, buf []byte, at int64, mapped bool) error {
	if mapped {
		if &buf[0] != &s.mm[at] { // the frames outgrew the buffer: a bug
			return fmt.Errorf("frames of %d bytes outgrew their space in %s", len(buf), s.name)
		}
		return nil
	}
	q.out = buf
	if err := q.st.files.writeAt(s.f, buf, at); err != nil {
		return err
	}
	s.alloc = max(s.alloc, at+int64(len(buf)))
	return nil
}

// unmap removes s's mapping, if any. wmu must be held.
func (q *queue) unmap(s *segment) error {
	if s.mm == nil {
		return nil
	}
	mm := s.mm
	s.mm = nil
	return q.st.files.munmap(s.f, mm)
}

// seal unmaps s and cuts its file to its written length. It reports
// whether it changed the file's length, which then needs a sync to be
// durable. wmu must be held.
func (q *queue) seal(s *segment) (cut bool, err error) {
	if err := q.unmap(s); err != nil {
		return false, err
	}
	if s.alloc <= s.size {
		return false, nil
	}
	if err := q.st.files.truncate(s.f, s.size); err != nil {
		return false, err
	}
	s.alloc = s.size
	return true, nil
}
