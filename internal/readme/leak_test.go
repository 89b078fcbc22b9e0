package readme_test

import (
	"testing"

	"github.com/lci-labs/compartment/internal/testleak"
)

func TestMain(m *testing.M) { testleak.VerifyMain(m) }
