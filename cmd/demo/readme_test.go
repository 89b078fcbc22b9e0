package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/apptest"
	"github.com/lci-labs/compartment/internal/cli"
)

// embeddedDefaultsMarker, on the line before a fenced sh block of the
// README, says that every command in the block works on a fresh machine
// with only Go installed. TestREADMEEmbeddedDefaults runs those commands.
const embeddedDefaultsMarker = "<!-- runs on embedded defaults -->"

// ciTestCommand is the test command CI runs; the README must give exactly
// this one.
const ciTestCommand = "go test -race ./..."

// demoCommand is how the README runs this command.
const demoCommand = "go run ./cmd/demo"

// readmeCommand is one command of a marked block: the command, its line in
// the README, and the comment that says what it does (its own and that of
// the comment-only lines after it).
type readmeCommand struct {
	line    int
	command string
	claim   string
}

// TestREADMEEmbeddedDefaults runs every command of the README's blocks
// marked embeddedDefaultsMarker, the way CI time allows, and checks what the
// README says of it. The demo runs in this process, on a copy of
// configs/demo.yaml, with short flags (skipped under -short); the test
// command is not run again (this test is part of it): it must be the
// command .ci/run runs. A command this test does not know fails it, so a
// block cannot claim more than is checked.
func TestREADMEEmbeddedDefaults(t *testing.T) {
	commands := markedCommands(t, apptest.RepoPath("README.md"))
	var seen []string
	for _, c := range commands {
		seen = append(seen, c.command)
		switch {
		case c.command == ciTestCommand:
			t.Run("the test command is the one CI runs", func(t *testing.T) {
				ciRunsTheTestCommand(t)
			})
		case c.command == demoCommand || strings.HasPrefix(c.command, demoCommand+" "):
			t.Run("the demo exits 0 and prints the dashboard's URL", func(t *testing.T) {
				if testing.Short() {
					t.Skip("runs the demo for about a minute; without -short: go test -race -run TestREADMEEmbeddedDefaults ./cmd/demo/")
				}
				runDemoAsTheREADMESays(t, c)
			})
		case strings.HasPrefix(c.command, "go test"):
			t.Errorf("README line %d: the test command is %q; it must be exactly %q, the command .ci/run runs", c.line, c.command, ciTestCommand)
		default:
			t.Errorf("README line %d: %q is marked %q, but %s does not know how to run it: teach it, or drop the marker", c.line, c.command, embeddedDefaultsMarker, "cmd/demo/readme_test.go")
		}
	}
	require.Contains(t, seen, demoCommand, "the README's first block runs the demo")
	require.Contains(t, seen, ciTestCommand, "the README's first block gives the test command")
	require.Less(t, commands[0].line, 15, "the commands come in the README's first lines")
}

// markedCommands returns the commands of the README's blocks marked
// embeddedDefaultsMarker, failing the test if there is none or a marker
// stands before anything but a fenced sh block.
func markedCommands(t *testing.T, path string) []readmeCommand {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var (
		out      []readmeCommand
		marked   bool // the previous line is the marker
		inBlock  bool
		blocks   int
		scanner  = bufio.NewScanner(bytes.NewReader(data))
		lineNo   int
		fenceErr = "README line %d: the marker must stand on the line just before a fenced sh block (```sh), got %q"
	)
	for scanner.Scan() {
		lineNo++
		line := scanner.Text()
		switch {
		case inBlock && strings.HasPrefix(line, "```"):
			inBlock = false
		case inBlock:
			command, comment, _ := strings.Cut(line, "#")
			command = strings.TrimSpace(command)
			comment = strings.TrimSpace(comment)
			switch {
			case command != "":
				out = append(out, readmeCommand{line: lineNo, command: command, claim: comment})
			case comment != "" && len(out) > 0:
				out[len(out)-1].claim += " " + comment
			}
		case marked:
			require.Equal(t, "```sh", line, fenceErr, lineNo, line)
			inBlock, marked = true, false
			blocks++
		case strings.TrimSpace(line) == embeddedDefaultsMarker:
			marked = true
		}
	}
	require.NoError(t, scanner.Err())
	require.False(t, inBlock, "README: a marked block is not closed")
	require.False(t, marked, "README: the marker is on the last line")
	require.Positive(t, blocks, "README: no block marked %q", embeddedDefaultsMarker)
	require.NotEmpty(t, out, "README: the marked blocks hold no command")
	return out
}

// ciRunsTheTestCommand checks that .ci/run runs ciTestCommand, as it is and
// again with the test backends unset, as a fresh machine runs it.
func ciRunsTheTestCommand(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(apptest.RepoPath(".ci/run"))
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	require.True(t, slices.Contains(lines, ciTestCommand), ".ci/run runs %q, the README's test command, against the real Redis and PostgreSQL", ciTestCommand)
	fresh := "env -u TEST_REDIS_URL -u TEST_DATABASE_URL " + ciTestCommand
	require.True(t, slices.Contains(lines, fresh), ".ci/run runs the README's test command as a fresh machine does: %q", fresh)
}

// runDemoAsTheREADMESays runs the demo command in this process, in a
// directory holding a copy of the shipped configs, so the defaults of
// -config and -plan resolve as they do in the repository. The copy of
// configs/demo.yaml differs in two ways only: its ports are 0 (this
// machine is shared; the README's URL is checked against the shipped file
// instead), and its demo data is smaller (2 months, 300 orders: a
// month-end of 20 reports instead of 40, seeded in a second; 20 reports
// still fill BEFORE's shared pool of 20; the third act starts the
// month-end over when it needs more). The flags shorten the warm-up and
// drop the minimum length of BEFORE, which is there for a person watching
// the dashboard. The claims: exit 0 (the walls held, BEFORE showed the
// outage, and in the third act the batch pool's limit fell and came
// back), and the dashboard's URL, printed.
func runDemoAsTheREADMESays(t *testing.T, c readmeCommand) {
	// No t.Parallel: it changes the working directory.
	shipped, err := app.Load(apptest.RepoPath("configs/demo.yaml"), func(string) string { return "" })
	require.NoError(t, err)
	require.True(t, shipped.Redis.Embedded, "configs/demo.yaml runs the embedded Redis")
	require.Empty(t, shipped.Database.URL, "configs/demo.yaml uses the embedded SQLite")
	require.NotEmpty(t, shipped.Database.SQLitePath, "configs/demo.yaml uses the embedded SQLite")
	url := regexp.MustCompile(`http://[^\s)]+`).FindString(c.claim)
	require.Equal(t, "http://"+shipped.HTTP.Listen+"/", url, "the README says where the dashboard is (README line %d: %q)", c.line, c.claim)

	dir := t.TempDir()
	for _, name := range []string{"demo.yaml", "priorities.yaml", "reports.yaml", "month-end.yaml"} {
		data, err := os.ReadFile(apptest.RepoPath("configs/" + name))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "configs"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "configs", name), data, 0o600))
	}
	demoYAML := filepath.Join(dir, "configs", "demo.yaml")
	apptest.ReplaceInConfig(t, demoYAML, "  embedded_addr: 127.0.0.1:16379\n", "  embedded_addr: 127.0.0.1:0\n")
	apptest.ReplaceInConfig(t, demoYAML, "  listen: 127.0.0.1:8089\n", "  listen: 127.0.0.1:0\n")
	apptest.ReplaceInConfig(t, demoYAML, "  max_connections: 20\n", "  max_connections: 20\n  seed_orders: 300\n  seed_months: 2\n")
	t.Chdir(dir)

	args := strings.Fields(strings.TrimPrefix(c.command, demoCommand))
	args = append(args, "-warmup", "1s", "-outage-min", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := run(ctx, cli.Env{Args: args, Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }})
	t.Logf("the demo took %s", time.Since(start).Round(time.Second))
	out := stdout.String()
	require.Equal(t, 0, code, "the README says %q exits 0 on the embedded defaults\n%s\n%s", c.command, out, stderr.String())
	require.Regexp(t, `(?m)^dashboard: http://127\.0\.0\.1:\d+/ `, out, "it prints the dashboard's URL")
	require.Contains(t, out, "=== BEFORE: one shared pool of 20 ===", "both phases ran")
	require.Contains(t, out, "BEFORE: the outage reproduced")
	require.Contains(t, out, "AFTER: the walls held: 20/20 reports completed")
	require.Contains(t, out, "=== SLOWDOWN: the report database 5x slower, then healthy again ===", "the third act ran")
	require.Contains(t, out, "SLOWDOWN: the adaptive limit followed the database")
	require.Contains(t, out, "\nexit 0: the run showed what it should (see above)\n")
}
