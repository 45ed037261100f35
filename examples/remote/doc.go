// Package remote is an example of building a broker of your own from
// Ferry's parts: a partition served over the network. A [Server] serves
// the queues of a [ferry.Storage] (filestore's, in cmd/ferry-remote) over
// HTTP/2; a [Storage] in another process opens them as [Queue]s, which
// are [ferry.Queue]s, so an unmodified [ferry.Broker], producer and
// consumer group run on queues that live elsewhere:
//
//	st, _ := remote.NewStorage("10.0.0.7:7420")
//	b, _ := ferry.NewBroker(ferry.WithStorage(st))
//	defer b.Close() // then st.Close()
//
// Messages cross the wire in Ferry's codec (package codec); the calls
// are plain HTTP/2 POSTs from the standard library (see wire.go for the
// protocol). Write is the seam the design notes describe: it encodes the
// batch, sends it to the partition's owner and stamps what that stored.
//
// This is an example of the building blocks, not a second distributed
// engine: one server holds each queue, with no replication. To scale
// Ferry out, use natsstore.
package remote
