package sqlstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/ferrytest"
	"github.com/ferrymq/ferry/sqlstore"
)

var features = ferrytest.Features{Persistent: true, TokensPersist: true}

func TestCursorStoreSQLite(t *testing.T) {
	ferrytest.TestCursorStore(t, features, func(t *testing.T, dir string) ferry.CursorStore {
		s, err := sqlstore.Open(context.Background(), openSQLite(t, dir))
		require.NoError(t, err)
		return s
	})
}

func TestCursorStorePostgres(t *testing.T) {
	openPG(t) // skips without a server
	ferrytest.TestCursorStore(t, features, func(t *testing.T, dir string) ferry.CursorStore {
		s, err := sqlstore.Open(context.Background(), openPG(t), sqlstore.WithTablePrefix(prefixFor(dir)))
		require.NoError(t, err)
		return s
	})
}
