package queues

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestScriptsUseThePauseMarker: the gate's Lua files spell the pause marker
// the Go side uses to tell its own pauses from an operator's.
func TestScriptsUseThePauseMarker(t *testing.T) {
	for _, f := range []string{"lua/gate_lib.lua", "lua/gate_clear.lua"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.True(t, strings.Contains(string(b), `"`+gatePauseValue+`"`), f)
	}
}
