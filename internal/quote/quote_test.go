package quote_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/quote"
)

func TestValue(t *testing.T) {
	require.Equal(t, `"vat-return"`, quote.Value("vat-return"))
	require.Equal(t, `"a\nb"`, quote.Value("a\nb"))
	long := strings.Repeat("x", 10<<20)
	got := quote.Value(long)
	require.Less(t, len(got), 120)
	require.True(t, strings.HasSuffix(got, "... (10485760 bytes)"), got)
	// Never cut inside a character.
	got = quote.Value(strings.Repeat("é", 100))
	require.True(t, strings.HasPrefix(got, `"`+strings.Repeat("é", 40)+`"...`), got)
}
