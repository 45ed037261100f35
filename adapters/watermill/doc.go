// Package ferrywm makes a [ferry.Broker] a Watermill Pub/Sub: [Publisher]
// implements [message.Publisher] and [Subscriber] implements
// [message.Subscriber], so Watermill's Router, middleware and components
// run over Ferry's topics, queues, consumer groups and (with package
// filestore) persistence.
//
//	b, _ := ferry.NewBroker()
//	pub, _ := ferrywm.NewPublisher(b, ferrywm.PublisherConfig{})
//	sub, _ := ferrywm.NewSubscriber(b, ferrywm.SubscriberConfig{ConsumerGroup: "billing"})
//	router.AddConsumerHandler("bill", "orders", sub, handle)
//
// # Topics
//
// A topic is created on its first Publish or Subscribe, with
// [PublisherConfig.Queues] or [SubscriberConfig.Queues] queues (default
// [DefaultQueues]) and the configured retention; an existing topic is used
// as it is. Topics live in the broker, so messages published before anyone
// subscribes are kept (within retention) and a new consumer group starts
// from the oldest one ([ferry.Earliest], see [SubscriberConfig.StartFrom]).
// Watermill topic names must be valid Ferry names ([ferry.ValidateTopicName]).
//
// # Messages
//
// A Watermill message becomes a [ferry.Message]: the payload is the body,
// the metadata are the headers and the UUID travels in the header
// [UUIDHeader]. The key, which picks the queue, comes from the metadata
// field [PublisherConfig.KeyMetadata] (default [DefaultKeyMetadata]):
// messages with the same key keep their order. Messages without a key are
// spread over the queues round robin, in runs when they come fast (Ferry's
// [ferry.KeyHashRouter]), and have no order between them.
//
// # Delivery
//
// Each Subscribe call runs one [ferry.Consumer] in the subscriber's consumer
// group, one handler call at a time, and hands its messages to the
// returned channel one at a time: the next message comes only after the
// previous one is acked or nacked, so a subscription has at most one
// unacked message, and sees the messages of a key in order as long as it
// acks them. Ack finishes a message (its cursor moves on).
//
// Nack finishes the message's offset too and writes it to the group's
// retry topic ([ferry.RetryTopic]), due after Ferry's retry backoff
// ([SubscriberConfig.RetryBackoff], doubling up to
// [SubscriberConfig.MaxRetryBackoff], on the broker's clock); its queue
// flows on meanwhile. When it is due the same message comes again, to
// whichever subscription of the group reads that queue of the retry topic:
// same UUID, payload and metadata, after the messages that followed it
// (a Nack gives up its key's order). [DeliveryFrom] gives its attempt
// number, counted across Nacks, subscriptions and restarts. It comes
// until it is acked or, when [SubscriberConfig.MaxAttempts] is set, goes
// to the group's dead-letter topic after the last attempt. With
// [ferry.Ordered] in [SubscriberConfig.ConsumerOptions] a nacked message
// waits out its backoff in its queue instead, holding back the messages
// after it, so a key keeps its order through Nacks. [ferry.OrderedByKey]
// there holds back only the nacked message's key: its other keys come on
// meanwhile (a subscription still hands its messages out one at a time,
// so the keys run in parallel only across subscriptions' handler calls,
// not within one).
//
// Subscriptions of the same group share the topic's queues (and those of
// its retry topic), each queue owned by one of them; delivery is at least
// once, so a message in flight when its queue moves (a subscriber joining
// or leaving) can come again. A message unacked when its subscription
// ends comes again to the group; Ferry cannot always tell that from a
// failure, so it may count as an attempt and come through the retry
// topic, after the backoff (with MaxAttempts set, its last attempt then
// sends it to the dead-letter topic).
//
// A message's context is cancelled after its Ack or Nack, when its
// subscription ends and on Close. Cancelling the context given to Subscribe
// ends that subscription and closes its channel; [Subscriber.Close] ends
// every subscription and returns once their channels are closed. Neither
// closes the broker, which the caller owns.
package ferrywm
