package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/codec"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reads that must see every acknowledged write (cursors, topics) go to
// the leader of a replicated stream: direct gets and consumers may be
// served by a follower that lags (measured: a Load right after a commit
// on R3 returned the offset before it). The topic and cursor buckets
// therefore have direct gets switched off, and listing keys asks the
// leader which subjects hold messages, then gets each key from it.

// leaderReads switches direct gets off on the bucket of kv when it is
// replicated (a bucket made before leaderKVConfig, with them on), and
// returns the bucket bound again.
func leaderReads(ctx context.Context, js jetstream.JetStream, c config, kv jetstream.KeyValue) (jetstream.KeyValue, error) {
	name := "KV_" + kv.Bucket()
	st, err := askExisting(ctx, c, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) })
	if err != nil {
		return nil, err
	}
	sc := st.CachedInfo().Config
	if sc.Replicas <= 1 || !sc.AllowDirect {
		return kv, nil
	}
	sc.AllowDirect = false
	if _, err := ask(ctx, c, func(ctx context.Context) (jetstream.Stream, error) { return js.UpdateStream(ctx, sc) }); err != nil {
		return nil, fmt.Errorf("switch off direct gets of %s: %w", name, err)
	}
	return askExisting(ctx, c, func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, kv.Bucket()) })
}

// leaderKeys returns the keys of kv matching filter that hold a message
// (a value, or a delete, purge or expiry marker), as the bucket's leader
// has them: a stream info is answered by the leader. last is the
// bucket's last revision as of that listing.
func leaderKeys(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, filter string) (keys []string, last uint64, err error) {
	st, err := js.Stream(ctx, "KV_"+kv.Bucket())
	if err != nil {
		return nil, 0, err
	}
	pre := "$KV." + kv.Bucket() + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(pre+filter))
	if err != nil {
		return nil, 0, err
	}
	keys = make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subj, pre))
	}
	return keys, info.State.LastSeq, nil
}

// liveEntries returns the live entries of kv whose keys match filter, as
// the bucket's leader has them. kv must be read from its leader (direct
// gets off: see leaderReads); for a bucket with direct gets, see
// leaderLive.
func liveEntries(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, filter string) ([]jetstream.KeyValueEntry, error) {
	keys, _, err := leaderKeys(ctx, js, kv, filter)
	if err != nil {
		return nil, err
	}
	out := make([]jetstream.KeyValueEntry, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, k := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			e, err := kv.Get(ctx, k)
			if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
				return
			}
			out[i], errs[i] = e, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	live := out[:0]
	for _, e := range out {
		if e != nil {
			live = append(live, e)
		}
	}
	return live, nil
}

// leaderEntry is a key's value as the leader of its bucket holds it.
type leaderEntry struct {
	key   string
	value []byte
	rev   uint64
}

// leaderLive returns the keys of kv matching filter that hold a value, as
// the bucket's leader has them, whatever the bucket's direct gets: both
// the listing and the gets are answered by the leader, so it sees every
// write the leader acknowledged. (A direct get, and a watch's consumer,
// may be served by a follower that lags.) last is the bucket's last
// revision as of the listing: the entries tell every write up to it.
func leaderLive(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, filter string) (live []leaderEntry, last uint64, err error) {
	keys, last, err := leaderKeys(ctx, js, kv, filter)
	if err != nil {
		return nil, 0, err
	}
	out := make([]leaderEntry, len(keys))
	isLive := make([]bool, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, k := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], isLive[i], errs[i] = leaderLast(ctx, js, kv, k)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	n := 0
	for i, e := range out {
		if isLive[i] {
			out[n] = e
			n++
		}
	}
	return out[:n], last, nil
}

// leaderLast reads key of kv from the bucket's leader (a stream message
// get, never a direct get); ok is false if the key holds no value: never
// written, or its last message is a delete, purge or expiry marker.
func leaderLast(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string) (e leaderEntry, ok bool, err error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + kv.Bucket() + "." + key})
	resp, err := js.Conn().RequestWithContext(ctx, apiPrefix(js)+"STREAM.MSG.GET.KV_"+kv.Bucket(), req)
	if err != nil {
		return e, false, err
	}
	var r struct {
		Message *struct {
			Seq    uint64 `json:"seq"`
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return e, false, fmt.Errorf("%w: stream message get response: %v", ferry.ErrCorrupt, err)
	}
	if r.Error != nil {
		if r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return e, false, nil
		}
		return e, false, r.Error
	}
	if r.Message == nil {
		return e, false, nil
	}
	if len(r.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(r.Message.Header)
		if err != nil {
			return e, false, fmt.Errorf("%w: headers of %s: %v", ferry.ErrCorrupt, key, err)
		}
		if h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "" {
			return e, false, nil // a delete or purge (nats.go's kv.go), or an expiry marker
		}
	}
	return leaderEntry{key: key, value: r.Message.Data, rev: r.Message.Seq}, true, nil
}

// apiPrefix is the subject prefix of js's API requests.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// leaderGet reads the message at seq from the stream's leader (not a
// follower's direct get); ok is false if the stream has none there.
func (q *queue) leaderGet(ctx context.Context, seq uint64) (m *ferry.EnhancedMessage, ok bool, err error) {
	req, _ := json.Marshal(map[string]uint64{"seq": seq})
	resp, err := q.s.js.Conn().RequestWithContext(ctx, apiPrefix(q.s.js)+"STREAM.MSG.GET."+q.stream, req)
	if err != nil {
		return nil, false, err
	}
	var r struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, false, fmt.Errorf("%w: stream message get response: %v", ferry.ErrCorrupt, err)
	}
	if r.Error != nil {
		if r.Error.Code == 404 {
			return nil, false, nil
		}
		return nil, false, r.Error
	}
	if r.Message == nil {
		return nil, false, nil
	}
	m, _, err = codec.Decode(r.Message.Data)
	if err != nil {
		return nil, false, err
	}
	m.Queue, m.Offset = q.id.Queue, int64(r.Message.Seq)-1
	return m, true, nil
}
