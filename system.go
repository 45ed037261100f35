package ferry

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// The system namespace. Topic names starting with '%' are the library's:
// the delay levels ("%DELAY%<n>"), the retry topics ("%RETRY%…", see
// [RetryTopic]) and the default dead-letter topics ("%DLQ%…", see
// [DeadLetterTopic]). Users read and consume them (dead letters above
// all) and inspect them, but never create, write to, grow or delete them
// through a [Broker] or a [Producer]: that is [ErrInvalidTopic]. Their
// retention never drops a message (unlimited, [Block]). The names the
// library derives from a (group, topic) pair are injective: two pairs
// never share a system topic.

// systemPrefix starts every system topic's name.
const systemPrefix = "%"

// IsSystemTopic reports whether name is reserved for the library (it
// starts with '%'): see the system namespace in the package doc.
func IsSystemTopic(name string) bool { return strings.HasPrefix(name, systemPrefix) }

// systemRetention is every system topic's: Block with no bound (and no
// age: a store may expire by age whatever was released), so that nothing
// waiting is ever dropped; what every group with a cursor on the topic
// committed is released (a delay level's mover, a retry topic's reader),
// which a memory queue drops at once and a file queue drops with its
// sealed segments wholly released. A dead-letter topic nobody reads
// keeps everything.
var systemRetention = Retention{MaxMessages: Unlimited, MaxBytes: Unlimited, Overflow: Block}

// reserved returns the error of a user's write, creation, growth or
// deletion of the system topic name.
func reserved(name string) error {
	return fmt.Errorf("%w: %q is a system topic (names starting with '%%' are the library's: read and consume them, never write them)", ErrInvalidTopic, name)
}

// escapeName maps s (any bytes) to topic-name bytes, injectively: the
// bytes of [A-Za-z0-9._-] stay as they are, every other byte becomes
// '%' and two uppercase hex digits. An escaped name holds no "%%".
func escapeName(s string) string {
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		plain = plainByte(s[i])
	}
	if plain {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) * 3)
	for i := 0; i < len(s); i++ {
		if c := s[i]; plainByte(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// RetryTopic returns the name of the system topic where group's retries
// of topic's messages wait: "%RETRY%", the group escaped (see below),
// "%%", the topic. The group's bytes outside [A-Za-z0-9._-] are written
// as '%' and two hex digits, so the name is injective: no two (group,
// topic) pairs share one. A pair whose name would be longer than
// [MaxTopicNameLen] is [ErrInvalidOption]: a consumer of that group and
// topic cannot retry off the queue.
func RetryTopic(group, topic string) (string, error) {
	if err := ValidateGroupCursorArgs(topic, group, 0); err != nil {
		return "", err
	}
	name := "%RETRY%" + escapeName(group) + "%%" + topic
	if len(name) > MaxTopicNameLen {
		return "", fmt.Errorf("%w: group %q and topic %q make a retry topic name of %d bytes, over %d", ErrInvalidOption, group, topic, len(name), MaxTopicNameLen)
	}
	return name, nil
}

// DeadLetterTopic returns the name of group's default dead-letter topic
// (see [WithDeadLetter]): "%DLQ%" and the group escaped as [RetryTopic]
// escapes it. A group whose name would be longer than [MaxTopicNameLen]
// is [ErrInvalidOption] (name its dead-letter topic with WithDeadLetter).
func DeadLetterTopic(group string) (string, error) {
	if group == "" || len(group) > 255 {
		return "", fmt.Errorf("%w: group name of %d bytes", ErrInvalidOption, len(group))
	}
	name := "%DLQ%" + escapeName(group)
	if len(name) > MaxTopicNameLen {
		return "", fmt.Errorf("%w: group %q makes a dead-letter topic name of %d bytes, over %d (name one with WithDeadLetter)", ErrInvalidOption, group, len(name), MaxTopicNameLen)
	}
	return name, nil
}

// isDeadLetterTopic reports whether name is a default dead-letter topic's.
func isDeadLetterTopic(name string) bool { return strings.HasPrefix(name, "%DLQ%") }

// createSystemTopic creates the system topic of meta (with the system
// retention) unless it exists: one that exists with other metadata (made
// by an older version) is used as it is.
func (b *Broker) createSystemTopic(ctx context.Context, meta TopicMeta) error {
	meta.Retention = systemRetention
	err := b.createTopic(ctx, meta)
	if err != nil && !errors.Is(err, ErrTopicExists) {
		return err
	}
	return nil
}
