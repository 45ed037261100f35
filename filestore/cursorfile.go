package filestore

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"

	"github.com/ferrymq/ferry"
)

// The cursor file's format (see cursors.go): decoding and encoding.

// decodeCursorFile reads a cursor file's bytes into m, for the store of
// identity id (legacy: one upgraded from version 1), reporting whether
// they were of version 1, and the finished sets into sets (unless nil).
// [ReadOnlyStore] reads the file with it too.
func decodeCursorFile(b []byte, id [16]byte, legacy bool, m map[cursorKey]int64, sets map[cursorKey][]int64) (v1 bool, err error) {
	if len(b) < 8 || crc32.Checksum(b[4:], castagnoli) != binary.LittleEndian.Uint32(b) {
		return false, fmt.Errorf("%w: cursor file checksum", ferry.ErrCorrupt)
	}
	withSets := len(b) >= 28 && string(b[4:8]) == cursorMagicSets
	switch {
	case len(b) >= 28 && (string(b[4:8]) == cursorMagic || withSets):
		if [16]byte(b[8:24]) != id {
			return false, fmt.Errorf("%w: cursor file of another store", ferry.ErrCorrupt)
		}
		b = b[24:]
	case legacy:
		v1 = true
		b = b[4:]
	default:
		return false, fmt.Errorf("%w: cursor file of version 1, in a store that never wrote one", ferry.ErrCorrupt)
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b))/(1+1+1+1+4+8) { // each entry takes at least 16 bytes
		return v1, fmt.Errorf("%w: cursor file: %d entries in %d bytes", ferry.ErrCorrupt, n, len(b))
	}
	str := func() (string, bool) {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return "", false
		}
		s := string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
		return s, true
	}
	for i := range n {
		topic, ok1 := str()
		group, ok2 := str()
		if !ok1 || !ok2 || len(b) < 12 {
			return v1, fmt.Errorf("%w: cursor file: entry %d cut short", ferry.ErrCorrupt, i)
		}
		queue, off := int(binary.LittleEndian.Uint32(b)), int64(binary.LittleEndian.Uint64(b[4:]))
		b = b[12:]
		if err := ferry.ValidateGroupCursorArgs(topic, group, queue); err != nil || off < 0 {
			return v1, fmt.Errorf("%w: cursor file: entry %d (%q, %q, %d, %d)", ferry.ErrCorrupt, i, topic, group, queue, off)
		}
		k := cursorKey{topic, group, queue}
		m[k] = off
		if !withSets {
			continue
		}
		set, rest, err := decodeFinishedSet(b, off)
		if err != nil {
			return v1, fmt.Errorf("%w: cursor file: entry %d (%q, %q, %d): %v", ferry.ErrCorrupt, i, topic, group, queue, err)
		}
		b = rest
		if len(set) > 0 && sets != nil {
			sets[k] = set
		}
	}
	if len(b) != 0 {
		return v1, fmt.Errorf("%w: cursor file: %d bytes after the last entry", ferry.ErrCorrupt, len(b))
	}
	return v1, nil
}

// decodeFinishedSet reads the finished set of a cursor at off from the
// front of b, returning the rest.
func decodeFinishedSet(b []byte, off int64) (set []int64, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > ferry.MaxFinishedSet || n > uint64(len(b)-k) {
		return nil, nil, errors.New("bad finished set length")
	}
	b = b[k:]
	if n > 0 {
		set = make([]int64, n)
	}
	last := off
	for i := range set {
		gap, k := binary.Uvarint(b)
		if k <= 0 || gap == 0 || gap > math.MaxInt64-uint64(last) {
			return nil, nil, fmt.Errorf("bad gap at %d of the finished set", i)
		}
		b = b[k:]
		last += int64(gap)
		set[i] = last
	}
	return set, b, nil
}

func (c *cursorStore) encode() []byte {
	keys := slices.SortedFunc(mapKeys(c.m), compareKeys)
	b := make([]byte, 4, 28+len(keys)*40)
	if len(c.sets) > 0 {
		b = append(b, cursorMagicSets...)
	} else {
		b = append(b, cursorMagic...)
	}
	b = append(b, c.st.id[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		b = append(b, byte(len(k.topic)))
		b = append(b, k.topic...)
		b = append(b, byte(len(k.group)))
		b = append(b, k.group...)
		b = binary.LittleEndian.AppendUint32(b, uint32(k.queue))
		b = binary.LittleEndian.AppendUint64(b, uint64(c.m[k]))
		if len(c.sets) > 0 {
			set := c.sets[k]
			b = binary.AppendUvarint(b, uint64(len(set)))
			last := c.m[k]
			for _, o := range set {
				b = binary.AppendUvarint(b, uint64(o-last))
				last = o
			}
		}
	}
	binary.LittleEndian.PutUint32(b, crc32.Checksum(b[4:], castagnoli))
	return b
}

func compareKeys(a, b cursorKey) int {
	return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.group, b.group), cmp.Compare(a.queue, b.queue))
}
