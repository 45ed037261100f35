package filestore

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"

	"github.com/ferrymq/ferry"
)

// The identity file of a store:
//
//	"FSTO" u32 version (1), 16 random bytes (the store's ID), u8 flags
//	(bit 0: legacy), CRC-32C of everything before it.
//
// Written once, when a store is first opened. The ID goes into the tag of
// every frame and index (queueTag) and into the cursor file, so that a
// file copied from another queue, topic or store fails a check. A store
// written before the identity existed gets one at its next Open, with the
// legacy flag: its untagged frames, indexes and cursor file (version 1)
// stay readable as they are, while everything written from then on is
// tagged.
const (
	storeFile  = "STORE"
	storeMagic = "FSTO"
	storeLen   = 4 + 4 + 16 + 1 + 4
)

// loadIdentity reads the store's identity, creating it when missing.
func (st *Store) loadIdentity() error {
	b, err := readBounded(st.root, storeFile, storeLen)
	if err == nil {
		st.id, st.legacy, err = parseIdentity(b)
		return err
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// A new store, or one from before the identity.
	if es, err := fs.ReadDir(st.root.FS(), "topics"); err == nil && len(es) > 0 {
		st.legacy = true
	}
	if _, err := fs.Stat(st.root.FS(), cursorFile); err == nil {
		st.legacy = true
	}
	_, _ = rand.Read(st.id[:])
	b = append([]byte(storeMagic), 1, 0, 0, 0)
	b = append(b, st.id[:]...)
	flags := byte(0)
	if st.legacy {
		flags = 1
		st.cfg.log.Info("ferry: filestore: store from before queue identity: its frames stay readable as they are, new ones are tagged", "dir", st.dir)
	}
	b = append(b, flags)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	return st.files.writeFileRename(storeFile, b, true)
}

// parseIdentity checks the bytes of an identity file and returns the
// store's ID and legacy flag. [ReadOnlyStore] reads the file with it too.
func parseIdentity(b []byte) (id [16]byte, legacy bool, err error) {
	if len(b) != storeLen || string(b[:4]) != storeMagic || binary.LittleEndian.Uint32(b[4:]) != 1 ||
		crc32.Checksum(b[:storeLen-4], castagnoli) != binary.LittleEndian.Uint32(b[storeLen-4:]) {
		return id, false, fmt.Errorf("%w: %s: bad identity file", ferry.ErrCorrupt, storeFile)
	}
	copy(id[:], b[8:24])
	return id, b[24]&1 != 0, nil
}

// key returns what the frames of queue id must carry.
func (st *Store) key(id ferry.QueueID) frameKey {
	return frameKey{tag: queueTag(st.id, id.Topic, id.Queue), legacy: st.legacy}
}
