package queues_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEngineDependsOnNoApplication: the engine (queues) and the packages
// under it (priority, bulkhead) link no database driver, no YAML parser and
// nothing of the story's application (reports, orders, the database, the
// commands), and of OpenTelemetry only its API. Importing the engine must not drag the report domain into a
// service that only wants pools.
func TestEngineDependsOnNoApplication(t *testing.T) {
	// database/sql/driver is linked by asynq's UUIDs; database/sql itself,
	// the connection pool every driver needs, must not be.
	forbidden := []string{
		"database/sql\x00",
		"github.com/jackc/pgx",
		"modernc.org/sqlite",
		"github.com/alicebob/miniredis",
		"go.yaml.in/yaml",
		"gopkg.in/yaml",
		"github.com/lci-labs/compartment/handlers",
		"github.com/lci-labs/compartment/internal/",
		"github.com/lci-labs/compartment/cmd/",
		// Tracing: the engine uses OpenTelemetry's API only; the SDK, its
		// exporters and grpc come in with the commands, not the library.
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters",
		"google.golang.org/grpc",
	}
	for _, pkg := range []string{"./", "../priority", "../bulkhead"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		require.NoError(t, err, string(out))
		deps := strings.Fields(string(out))
		require.NotEmpty(t, deps)
		for _, dep := range deps {
			for _, f := range forbidden {
				require.Falsef(t, strings.HasPrefix(dep+"\x00", f), "%s depends on %s", pkg, dep)
			}
		}
	}
}
