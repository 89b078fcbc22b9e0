package readme_test

import (
	"context"
	"encoding/json"
	"go/format"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/apptest"
)

// maxREADMELines is how long the README may grow: a front page, not a
// manual (river's README is 227 lines, asynq's 317).
const maxREADMELines = 250

// docs returns README.md and every page under docs/, relative to the
// repository.
func docs(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(apptest.RepoPath("docs/*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, pages)
	out := []string{"README.md"}
	for _, p := range pages {
		out = append(out, "docs/"+filepath.Base(p))
	}
	return out
}

func read(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(apptest.RepoPath(rel))
	require.NoError(t, err)
	return string(data)
}

// fence opens or closes a fenced code block.
var fence = regexp.MustCompile("^\\s*(```|~~~)")

// prose returns the page with its fenced code blocks and inline code
// blanked out (newlines kept, so offsets still give line numbers), and the
// GitHub anchors of its headings.
func prose(text string) (string, map[string]bool) {
	lines := strings.Split(text, "\n")
	anchors := map[string]bool{}
	inFence := false
	for i, line := range lines {
		switch {
		case fence.MatchString(line):
			inFence = !inFence
			lines[i] = ""
		case inFence:
			lines[i] = ""
		case strings.HasPrefix(line, "#"):
			if m := heading.FindStringSubmatch(line); m != nil {
				base := slug(m[1])
				a := base
				for n := 1; anchors[a]; n++ {
					a = base + "-" + strconv.Itoa(n)
				}
				anchors[a] = true
			}
		}
	}
	out := inlineCode.ReplaceAllStringFunc(strings.Join(lines, "\n"), func(code string) string {
		return strings.Map(func(r rune) rune {
			if r == '\n' {
				return r
			}
			return ' '
		}, code)
	})
	return out, anchors
}

var (
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	inlineCode = regexp.MustCompile("`[^`]*`")
	// link matches an inline link or image and captures its target.
	link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]*)(?:\s+"[^"]*")?\)`)
)

// slug is the anchor GitHub gives a heading: lower case, spaces as
// hyphens, and every character but letters, digits, hyphens and
// underscores dropped.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsNumber(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// TestLinksLeadSomewhere: every relative link and image in README.md and
// docs/*.md names a file that exists, and every #anchor, in the same page
// or another, a heading of that page.
func TestLinksLeadSomewhere(t *testing.T) {
	anchorsOf := map[string]map[string]bool{}
	texts := map[string]string{}
	for _, page := range docs(t) {
		texts[page], anchorsOf[page] = prose(read(t, page))
	}
	checked := 0
	for _, page := range docs(t) {
		text := texts[page]
		for _, m := range link.FindAllStringSubmatchIndex(text, -1) {
			target := text[m[2]:m[3]]
			where := page + ":" + strconv.Itoa(strings.Count(text[:m[0]], "\n")+1)
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			file, anchor, _ := strings.Cut(target, "#")
			require.False(t, strings.HasPrefix(file, "/"), "%s: link %q: make it relative to the page", where, target)
			rel := page
			if file != "" {
				rel = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
				_, err := os.Stat(apptest.RepoPath(rel))
				require.NoError(t, err, "%s: link %q leads nowhere", where, target)
			}
			if anchor == "" {
				continue
			}
			anchors, ok := anchorsOf[rel]
			if !ok && strings.HasSuffix(rel, ".md") {
				_, anchors = prose(read(t, rel))
				anchorsOf[rel] = anchors
			}
			require.True(t, anchors[anchor], "%s: link %q: %s has no heading with the anchor #%s", where, target, rel, anchor)
		}
	}
	require.Greater(t, checked, 50, "the links were found")
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"What a reload (SIGHUP) changes":           "what-a-reload-sighup-changes",
		"10. The cluster-wide cap at full speed":   "10-the-cluster-wide-cap-at-full-speed",
		"The runner: `go run ./cmd/bench`":         "the-runner-go-run-cmdbench",
		"Looking at the queues with asynq's tools": "looking-at-the-queues-with-asynqs-tools",
	} {
		t.Run(heading, func(t *testing.T) { require.Equal(t, want, slug(heading)) })
	}
}

// TestREADMEIsAFrontPage: the README stays short; the manual lives in
// docs/.
func TestREADMEIsAFrontPage(t *testing.T) {
	lines := strings.Count(read(t, "README.md"), "\n")
	require.LessOrEqual(t, lines, maxREADMELines, "README.md has %d lines: move the details to a page under docs/ and link it", lines)
}

// section returns the text of a page's section "## title", up to the next
// section of the same level.
func section(t *testing.T, page, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(read(t, page), "\n## "+title+"\n")
	require.True(t, ok, "%s has a section %q", page, title)
	body, _, _ := strings.Cut(rest, "\n## ")
	return body
}

// firstBlock returns the first fenced block of text whose info string is
// lang.
func firstBlock(t *testing.T, text, lang string) string {
	t.Helper()
	_, rest, ok := strings.Cut(text, "```"+lang+"\n")
	require.True(t, ok, "a ```%s block", lang)
	block, _, ok := strings.Cut(rest, "\n```")
	require.True(t, ok, "the ```%s block is closed", lang)
	return block + "\n"
}

// shellLines returns a shell block's commands, without their comments (a #
// outside single quotes, at the start or after a space).
func shellLines(block string) []string {
	var out []string
	for _, line := range strings.Split(block, "\n") {
		quoted := false
		for i, c := range line {
			if c == '\'' {
				quoted = !quoted
			}
			if c == '#' && !quoted && (i == 0 || line[i-1] == ' ') {
				line = line[:i]
				break
			}
		}
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// TestOperatorTourIsTested: every line of the README's operator tour is a
// line of the walk-through in docs/WALKTHROUGH.md, which cmd/enqueue's
// TestWalkThrough runs against a test Redis.
func TestOperatorTourIsTested(t *testing.T) {
	tour := shellLines(firstBlock(t, section(t, "README.md", "Run it against Redis"), "sh"))
	walk := shellLines(firstBlock(t, section(t, "docs/WALKTHROUGH.md", "Running a worker and enqueuing reports"), "sh"))
	require.GreaterOrEqual(t, len(tour), 5)
	for _, line := range tour {
		require.Contains(t, walk, line, "the README's tour runs %q, which the tested walk-through in docs/WALKTHROUGH.md does not", line)
	}
}

// TestLibraryPageShowsTheRunnableExample: the complete example in
// docs/LIBRARY.md is queues/example_test.go's, which go test runs: each of
// its lines is a line of that file, in the same order.
func TestLibraryPageShowsTheRunnableExample(t *testing.T) {
	block := firstBlock(t, section(t, "docs/LIBRARY.md", "A complete example"), "go")
	source := strings.Split(read(t, "queues/example_test.go"), "\n")
	at := 0
	for _, line := range strings.Split(strings.TrimSuffix(block, "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		i := slices.Index(source[at:], line)
		require.GreaterOrEqual(t, i, 0, "docs/LIBRARY.md shows %q, which queues/example_test.go does not have (after line %d)", line, at)
		at += i + 1
	}
	require.Contains(t, block, "func Example() {")
}

// exampleFile is the README's library example as a Go file: the block
// declares what a program declares, and calls sendMail, the service's own.
const exampleFile = `package readmeexample

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/lci-labs/compartment/queues"
)

// sendMail stands for the service's own code, which the example calls.
func sendMail(context.Context, string) error { return nil }

`

// TestREADMELibraryExampleCompiles builds the README's library example,
// as gofmt formats it, against the packages in this repository: go build
// with an overlay that puts it in a package of its own, without writing
// into the repository.
func TestREADMELibraryExampleCompiles(t *testing.T) {
	block := firstBlock(t, section(t, "README.md", "Use it as a library"), "go")
	src := exampleFile + block
	formatted, err := format.Source([]byte(src))
	require.NoError(t, err, "the README's library example parses")
	require.Equal(t, src, string(formatted), "the README's library example is gofmt-formatted")
	if testing.Short() {
		t.Skip("builds the README's example with the go command; without -short: go test -run TestREADMELibraryExampleCompiles ./internal/readme/")
	}
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command, to build the README's example")

	dir := t.TempDir()
	file := filepath.Join(dir, "example.go")
	require.NoError(t, os.WriteFile(file, []byte(src), 0o600))
	root, err := filepath.Abs(apptest.RepoPath("."))
	require.NoError(t, err)
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "internal", "readme", "readmeexample", "example.go"): file},
	})
	require.NoError(t, err)
	overlayFile := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(overlayFile, overlay, 0o600))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-overlay", overlayFile, "./internal/readme/readmeexample")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the README's library example does not build against the current API:\n%s", out)
}

// fuzzTarget is a fuzz target: its package's name and the function's.
type fuzzTarget struct{ pkg, name string }

func (f fuzzTarget) String() string { return f.pkg + "." + f.name }

var (
	fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	// fuzzRow is a row of the fuzz table in docs/RELIABILITY.md.
	fuzzRow = regexp.MustCompile("(?m)^\\| `(\\w+)\\.(Fuzz\\w+)` \\|.*\\| (yes|no)\\b[^|]*\\|$")
	// ciFuzz is a line of .ci/run that fuzzes a target.
	ciFuzz = regexp.MustCompile(`(?m)^go test .*-fuzz '\^(Fuzz\w+)\$' .*\./(\S+?)/?$`)
	// fuzzCount is a sentence of the docs that says how many targets there are.
	fuzzCount   = regexp.MustCompile("(?i)\\b(\\w+) (?:`go test -fuzz` )?fuzz targets\\b")
	numberWords = []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"}
)

// TestFuzzTargetsAsDocumented: the fuzz table in docs/RELIABILITY.md lists
// exactly the fuzz targets in the code, its last column says yes for
// exactly those .ci/run fuzzes, every "N fuzz targets" in the docs gives
// their number, and docs/TESTING.md names each one.
func TestFuzzTargetsAsDocumented(t *testing.T) {
	var inCode []fuzzTarget
	root := apptest.RepoPath(".")
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzzFunc.FindAllStringSubmatch(string(data), -1) {
			inCode = append(inCode, fuzzTarget{filepath.Base(filepath.Dir(path)), m[1]})
		}
		return nil
	}))
	require.NotEmpty(t, inCode)

	var inTable, fuzzedInCI []fuzzTarget
	for _, m := range fuzzRow.FindAllStringSubmatch(section(t, "docs/RELIABILITY.md", "Fuzzing"), -1) {
		inTable = append(inTable, fuzzTarget{m[1], m[2]})
		if m[3] == "yes" {
			fuzzedInCI = append(fuzzedInCI, fuzzTarget{m[1], m[2]})
		}
	}
	var inCI []fuzzTarget
	for _, m := range ciFuzz.FindAllStringSubmatch(read(t, ".ci/run"), -1) {
		inCI = append(inCI, fuzzTarget{filepath.Base(m[2]), m[1]})
	}
	require.NotEmpty(t, inCI, ".ci/run fuzzes some targets")
	require.ElementsMatch(t, inCode, inTable, "docs/RELIABILITY.md's fuzz table lists the fuzz targets of the code")
	require.ElementsMatch(t, inCI, fuzzedInCI, "docs/RELIABILITY.md's fuzz table says which targets .ci/run fuzzes")

	counts := 0
	for _, page := range docs(t) {
		for _, m := range fuzzCount.FindAllStringSubmatch(read(t, page), -1) {
			n, err := strconv.Atoi(m[1])
			if err != nil {
				if n = slices.Index(numberWords, strings.ToLower(m[1])); n < 0 {
					continue // "the fuzz targets", not a count
				}
			}
			counts++
			require.Equal(t, len(inCode), n, "%s says %q, but the code has %d: %v", page, m[0], len(inCode), inCode)
		}
	}
	require.Positive(t, counts, "the docs say how many fuzz targets there are")

	named := regexp.MustCompile(`\bFuzz\w+`).FindAllString(section(t, "docs/TESTING.md", "Fuzzing"), -1)
	for _, f := range inCode {
		require.Contains(t, named, f.name, "docs/TESTING.md names every fuzz target")
	}
}
