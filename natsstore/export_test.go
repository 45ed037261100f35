package natsstore

import (
	"context"

	"github.com/ferrymq/ferry"
)

// DeleteMember deletes the member key of member in g, as the server does
// when the key expires: the session sees it and ends. A test hook.
func DeleteMember(ctx context.Context, c *Coordinator, g ferry.GroupKey, member string) error {
	return c.members.Delete(ctx, groupPrefix(g)+"."+encodeToken(member))
}
