// Package remote is an example of building a broker of your own from
// Ferry's parts: a partition served over the network. A [Server] serves
// the queues of a [ferry.Storage] (filestore's, in cmd/ferry-remote) over
// HTTP/2; a [Storage] in another process opens them as [Queue]s, which
// are [ferry.Queue]s, and keeps its cursors there too (a
// [ferry.CursorStore]), so an unmodified [ferry.Broker], producer and
// consumer group run on queues and cursors that live elsewhere:
//
//	st, _ := remote.NewStorage("10.0.0.7:7420")
//	b, _ := ferry.NewBroker(ferry.WithStorage(st), ferry.WithCursorStore(st))
//	defer b.Close() // then st.Close()
//
// Messages cross the wire in Ferry's codec (package codec); the calls
// are plain HTTP/2 POSTs from the standard library (see wire.go for the
// protocol). Write is the seam the design notes describe: it encodes the
// batch, sends it to the partition's owner and stamps what that stored.
//
// # Why HTTP/2 from the standard library
//
// The wire needs three things: many calls in flight on one connection
// (a blocked Read per queue beside the writes), a call's cancellation
// reaching the server (a consumer that stops reading, a Write whose ctx
// ends), and a message that is either all there or an error. HTTP/2 gives
// all three — streams, RST_STREAM into the handler's context, and a body
// that ends with END_STREAM or fails — and net/http speaks it without TLS
// since Go 1.24 ([net/http.Protocols]), so the example needs no module
// beyond Ferry and stays readable: a call is an ordinary POST, a server
// an ordinary [http.Handler]. gRPC (with a raw-bytes codec and
// hand-written service descriptors, there being no protoc here) or
// connect-go would give the same over more machinery, and generated code
// or descriptors a reader must learn before the queue.
//
// The protocol: every call is a POST to /ferry.remote.v1/<Method>; calls
// on a queue name it in the query. Write's body is a count of batches,
// each a count of messages and the messages in codec encoding; its answer
// is each batch's outcome (first offset and store times, or an error
// code and text). Read's answer is the queue's offsets, a count and the
// messages. The other calls carry JSON. A failed call answers a JSON
// {"code", "message"}; the code names the ferry sentinel the client's
// error wraps ([ServerError]).
//
// This is an example of the building blocks, not a second distributed
// engine: one server holds each queue, with no replication. To scale
// Ferry out, use natsstore.
package remote
