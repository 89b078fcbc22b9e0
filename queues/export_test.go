package queues

import (
	"time"

	"github.com/lci-labs/compartment/queues/internal/rdb"
)

// SetBacklogRecount sets how old c's door lets the bound of a pool's
// backlog get before it counts exactly again (1s by default), so that a
// test can pin down when the count happens.
func SetBacklogRecount(c *Client, d time.Duration) { c.setBacklogRecount(d) }

// DoorScripts returns the SHA1 of the door's scripts: its fast path's and
// its general one's, so that a test can tell which one a call ran.
func DoorScripts() (fast, general string) { return rdb.DoorScriptHashes() }
