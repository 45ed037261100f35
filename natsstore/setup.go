package natsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferrymq/ferry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Setting up: the streams and buckets a Store and a Coordinator bind or
// create, in many processes at once.
//
// JetStream answers no one for some requests about a replicated stream
// that is being created: an info that reaches no member of its group yet
// (seen: a bind of a bucket another process was creating waited 30 s), an
// update proposed before the group has elected its leader. So set-up
// requests are asked in tries of at most setupTry, again while a try goes
// unanswered, until the caller's context ends; they are creates of the
// same configuration and reads, which are safe to repeat. And nothing is
// updated right after it is created: a stream is created first and
// updated only if its configuration differs, and a bucket read from its
// leader is created with direct gets off.

// setupTry bounds one try of a set-up request. A create of a new R3
// stream takes tens of milliseconds (a Raft election); a try cut short
// is asked again, and a create of an existing stream with the same
// configuration is answered at once.
const setupTry = time.Second

// ask calls f with ctx bounded by setupTry (and by the op timeout when
// ctx has no deadline) until it is answered or ctx ends.
func ask[T any](ctx context.Context, cfg config, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := cfg.bound(ctx)
	defer cancel()
	for {
		tctx, tcancel := context.WithTimeout(ctx, setupTry)
		v, err := f(tctx)
		tcancel()
		if err == nil || !unanswered(err) || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-time.After(retryBackoff):
		case <-ctx.Done():
			return v, err
		}
	}
}

// askCreate is [ask] for a create of a stream or bucket: a create
// refused with code 10049, "error creating store for stream", is asked
// again after a short backoff, at most createTries times in all and
// within ctx; any other answer is returned as is. Deleting an account's
// last stream, nats-server (v2.15, stream.go) removes the account's
// "streams" directory and then the account's directory in a goroutine,
// racing the next stream's store being made in the account: its mkdir
// finds no parent ("could not create storage directory - mkdir
// …/jetstream/$G/streams: no such file or directory"). So a user who
// deletes their last topic and creates another can be refused once;
// the create asked again makes the directories anew. A create refused
// with 10005, "no suitable peers for placement", is asked again until
// the op timeout (backoff at most placementBackoff): a cluster just
// started, or a server just restarted, has peers the meta leader does not
// count as online yet (TestNodeFailure's first create was refused so
// once, 1.3 s after the cluster came up).
func askCreate[T any](ctx context.Context, cfg config, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := cfg.bound(ctx)
	defer cancel()
	backoff := createBackoff
	for try := 1; ; try++ {
		v, err := ask(ctx, cfg, f)
		again := storeRefused(err) && try < createTries || placementRefused(err)
		if err == nil || !again || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return v, err
		}
		backoff = min(2*backoff, placementBackoff)
	}
}

// placementBackoff caps askCreate's wait between tries of a create
// refused for want of peers.
const placementBackoff = 250 * time.Millisecond

// placementRefused: a create the server refused because too few peers
// are online for its replicas (JSClusterNoPeersErrF).
func placementRefused(err error) bool {
	code, _ := apiCode(err)
	return code == 10005
}

// createTries and createBackoff bound [askCreate]'s tries: the server's
// removal goroutine runs at once, so the second try nearly always finds
// it done; the tries span 10+20+…+320 ms, 630 ms in all, for a loaded
// machine.
const (
	createTries   = 7
	createBackoff = 10 * time.Millisecond
)

// storeRefused: a create the server refused because it could not make
// the stream's store (JSStreamCreateErrF wrapping errStreamStoreFailed).
func storeRefused(err error) bool {
	code, _ := apiCode(err)
	return code == 10049
}

// askExisting is [ask] for a read of a stream known to exist (this call
// created it, or a create was refused because it exists): "not found"
// is asked again too. A server of the cluster answers "stream not found"
// for a stream just created until its group has made it there (seen:
// three Opens creating one deployment's R3 buckets at once, 1 in 6
// under load; the bind after the create, or a queue's first info, was
// told the stream it had just created does not exist).
func askExisting[T any](ctx context.Context, cfg config, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := cfg.bound(ctx)
	defer cancel()
	for {
		v, err := ask(ctx, cfg, f)
		if err == nil || !notFound(err) || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-time.After(retryBackoff):
		case <-ctx.Done():
			return v, err
		}
	}
}

// notFound: a stream or bucket reported absent.
func notFound(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)
}

// unanswered: a request no server answered, or answered only that it
// could not tell yet (no leader). jetstream reports no responders to a
// publish (a KV put or delete too) as ErrNoStreamResponse.
func unanswered(err error) bool {
	code, _ := apiCode(err)
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		code == 10008 /* cluster not available */ || code == 10118 /* stream offline */
}

// bucket opens (creating if absent) the bucket "<prefix>_<name>". A
// bucket read from its leader (leader: topics, cursors) is made with
// direct gets off when replicated (see leaderKVConfig).
func bucket(ctx context.Context, js jetstream.JetStream, cfg config, name string, ttl, leader bool) (jetstream.KeyValue, error) {
	full := cfg.prefix + "_" + name
	bind := func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, full) }
	kv, err := ask(ctx, cfg, bind)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: bucket %s", full), Err: err}
	}
	kc := jetstream.KeyValueConfig{Bucket: full, Replicas: cfg.replicas, Storage: cfg.storage, History: 1}
	if ttl {
		kc.TTL = cfg.ttl
		kc.LimitMarkerTTL = cfg.ttl
	}
	if leader && cfg.replicas > 1 {
		_, err = askCreate(ctx, cfg, func(ctx context.Context) (jetstream.Stream, error) {
			return js.CreateStream(ctx, leaderKVConfig(kc))
		})
		if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = askExisting(ctx, cfg, bind) // made now, or before by another version
		}
	} else {
		kv, err = askCreate(ctx, cfg, func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, kc) })
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = askExisting(ctx, cfg, bind) // another process made it first
		}
	}
	if err != nil {
		return nil, &ferry.Error{Op: fmt.Sprintf("natsstore: create bucket %s", full), Err: err}
	}
	return kv, nil
}

// leaderKVConfig is the stream jetstream's CreateKeyValue makes for kc
// (nats.go v1.55; no TTL, mirror or sources), with direct gets off.
// Made so, a bucket needs no update after its creation.
func leaderKVConfig(kc jetstream.KeyValueConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              "KV_" + kc.Bucket,
		Subjects:          []string{"$KV." + kc.Bucket + ".>"},
		MaxMsgsPerSubject: int64(max(kc.History, 1)),
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		Storage:           kc.Storage,
		Replicas:          max(kc.Replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        2 * time.Minute,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		AllowDirect:       false,
		Discard:           jetstream.DiscardNew,
	}
}

// openStream creates a queue's stream, or updates the stream there when
// its configuration differs (a topic's retention changed). Create comes
// first: CreateOrUpdateStream updates first, and an update of a stream
// another process has just created can go unanswered.
func (s *Store) openStream(ctx context.Context, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	h, err := askCreate(ctx, s.cfg, func(ctx context.Context) (jetstream.Stream, error) { return s.js.CreateStream(ctx, sc) })
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		h, err = ask(ctx, s.cfg, func(ctx context.Context) (jetstream.Stream, error) { return s.js.UpdateStream(ctx, sc) })
	}
	return h, err
}
