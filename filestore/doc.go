// Package filestore is a file-backed [ferry.Storage] and [ferry.CursorStore]:
// topics, messages and cursors that survive a restart.
//
//	st, err := filestore.Open(dir, filestore.WithSync(filestore.SyncAlways))
//	if err != nil { ... }
//	defer st.Close() // after the broker
//	b, err := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
//
// # Layout
//
// One directory holds everything (folders 0700, files 0600). Per topic a
// folder with its metadata; per queue a folder of segment files named by
// the offset of their first message (%020d.log), each sealed segment with
// a sparse index (%020d.index: one entry per 4 KiB, rebuilt from the
// segment whenever it fails a check). <dir>/STORE holds the store's
// identity, a random ID written at its first Open. Topic names are checked with
// [ferry.ValidateTopicName] before they reach the file system, and every
// file is opened through an [os.Root], so no name leads outside the
// directory. A flock on <dir>/LOCK makes the store exclusive: a second
// [Open], in this or another process, fails with [ErrLocked].
//
// # Reading without the lock
//
// [OpenReadOnly] opens a directory that another process (or this one)
// holds, for inspection: it takes no lock, writes, creates and cuts
// nothing, and follows the owner's appends, roll-overs and retention by
// reading the files again. It tells the end of a newest segment as Open
// does (see Recovery), and tells the owner's writes in progress from
// either: a torn tail, or space reserved and a write in progress while
// the owner runs, is just the end; damage, which the owner's next Open
// refuses, is [ferry.ErrCorrupt] naming the file and byte. Its writes are
// [ErrReadOnly]. [Verify] checks every file of a directory the same way,
// and may run while the owner writes. See [ReadOnlyStore].
//
// # Frames
//
// A Write is stored as one frame (several when it exceeds the frame
// bound): a length, a CRC-32C covering the rest, the queue's tag, the
// offsets, then the messages in the ferry codec. Every length is bounded by
// the frame maximum and by the bytes left in the file before anything is
// allocated. The tag is a hash of the store's ID, the topic and the queue
// index; indexes carry it too, and the cursor file the store's ID. So a
// frame, segment or index copied from another queue, topic or store is
// caught at Open or on Read: an intact frame with the wrong tag is
// [ferry.ErrCorrupt] ("written for another queue, topic or store"), never
// served; a misplaced index is rebuilt; a misplaced cursor file is
// ErrCorrupt.
//
// # Stores from before the identity (format version 1)
//
// A store written before frames carried a tag has no STORE file. Its next
// Open gives it one, marked legacy: its untagged frames (version 1), its
// indexes and its cursor file stay readable as they are, checked as before
// (checksums covering the offsets, and every message's queue index checked
// on read), while everything written from then on is tagged, and the
// cursor file is rewritten with the ID at once. Nothing needs converting;
// the old frames go with retention. Untagged frames are refused in a store
// created with tags. (An old segment copied between queues of a legacy
// store is caught only by the queue index in its messages; to bind all the
// data, copy it through a new store.) Older binaries cannot read a store
// once it has tagged frames.
//
// # Durability
//
// [SyncAlways] (the default) acknowledges a Write after fdatasync; each
// queue has one writer goroutine, so concurrent writers share one write
// and one fdatasync (group commit). One goroutine shares them too through
// [ferry.Producer.SendAsync], which writes a queue's waiting sends as one
// Write. [SyncEvery] syncs on an interval,
// [SyncNever] leaves it to the operating system; under both a Write
// appends its own frame in the calling goroutine (under the queue's write
// lock) and returns once it is in the page cache, which a crash of the
// process does not lose. Directories are synced after every create,
// rename and delete. A write, fsync or space reservation error makes the
// queue fail every later write with [ErrFailed]: it is never retried.
//
// The active segment of each queue has disk space reserved ahead of its
// writes with fallocate, in steps doubling from 64 KiB up to the segment
// size. Under SyncEvery and SyncNever on 64-bit Linux it is also
// memory-mapped (shared, up to the segment size of address space per open
// queue): a write copies its frame into the mapping, the page cache itself,
// with no system call, and the reservation means a full disk fails a write
// instead of raising SIGBUS when the kernel writes the page back. (A SIGBUS
// remains possible if the file is cut by someone else while mapped, or if
// the disk fails to read back a page being written.) Under SyncAlways a
// group is one pwrite into the reserved space, so that most fdatasyncs find
// no new block or file size to record; a mapping would not pay there, since
// every fdatasync makes the kernel write-protect the mapped pages and the
// next write fault. On other platforms, and on file systems that cannot
// reserve space or when the mapping fails, every write is a plain pwrite. A
// sealed segment is cut to the length of its frames; a crash leaves the
// newest one longer, zeros after its last frame, which Open cuts like a
// torn tail (see Recovery).
//
// A write that fails at any step (a full disk at the space reservation,
// the pwrite, the fdatasync, or any call of a roll: sealing, the index
// file, the new segment) is taken back: the segments it created are
// removed, each removal made durable, before the segment it sealed is cut
// back to its length before the write, so no step leaves a gap in the
// offsets; if a step of that undo fails too, it stops, leaving frames
// never acknowledged, which Open takes as written. The queue then fails
// every write with [ErrFailed] until the store is opened again, and Open
// accepts the files with every acknowledged message intact. Retention
// deletes oldest first and stops at a failed delete, so the segments left
// are always contiguous.
//
// # Recovery
//
// [Open] reads the newest segment of each queue and cuts a torn tail: a
// bad frame with nothing intact after it (an incomplete frame, a
// zero-filled or garbage tail, space reserved and not written), which
// under SyncAlways, and under any policy after a crash of the process
// alone, only ever drops unacknowledged writes. A bad frame followed by an
// intact one is damage, not a torn tail: Open fails with
// [ferry.ErrCorrupt] naming the file and byte and how many messages the
// intact frames after it hold, and cuts nothing. An operator who accepts
// that loss opens the store [WithRepair]: the segment is cut at the bad
// frame, the bytes cut are first saved beside it (%020d.log.corrupt), and
// [Store.Recovery] lists the cut with Damaged set and the messages
// dropped. (A power loss under SyncEvery or SyncNever can leave a hole of
// zeros before frames written later but reaching the disk first; that too
// is reported as damage, for the operator to repair.) Older segments are
// sealed: their index and last frames are checked at Open ([WithVerify]
// checks every frame), and a bad frame in one is [ferry.ErrCorrupt], naming
// the file and byte, at Open or on Read — never skipped. Committed cursors
// are then clamped to their queue's retained range; [Store.Recovery] and
// the logger report every cut, rebuilt index and clamp.
//
// # Retention
//
// Retention deletes whole sealed segments, oldest first: those whose
// messages are all older than MaxAge, and those without which the queue
// still holds MaxMessages messages and MaxBytes bytes (Kafka's rule: a
// queue keeps at least its bounds). A segment stops taking messages at an
// eighth of each bound, so a queue keeps at most about an eighth more than
// its bounds, and exactly its bounds when a bound is 15 messages or fewer.
// With [ferry.Block] overflow the queue implements [ferry.TryWriter] and
// [ferry.Releaser]: a write waits until released segments can be deleted
// to make room; a Block queue with no bound (both Unlimited), whose
// writes never need room, deletes its wholly released sealed segments at
// once (Ferry's delay levels are such queues).
//
// # Reads
//
// Each queue keeps its most recent messages decoded in memory
// ([WithCache]); readers that keep up get the stored pointers, shared like
// the memory queue's. Older messages are read from disk through the sparse
// index and decoded for each Read. Sealed segments are opened when read,
// their descriptors kept in a cache shared by the store's queues that
// closes the least recently used beyond [WithMaxOpenSegments]: a store
// keeps as many segments as retention lets it, with a bounded number of
// open files.
package filestore
