package app

import (
	"bufio"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/reports"
)

// referencePath is the configuration reference, which lists every key.
const referencePath = "../../docs/CONFIG.md"

// fileKeys walks the yaml keys of the struct type t as a file writes them:
// "pools[].size" for a key in each entry of a list, "pools[].job_type_rates.*.limit"
// for one under any key of a map. leaves are the keys that hold a value;
// all adds those that hold a mapping of further keys (redis.sentinel,
// pools[].breaker), which a reference may list too.
func fileKeys(t reflect.Type, prefix string) (leaves, all []string) {
	for f := range t.Fields() {
		name := tagName(f, "yaml")
		if !f.IsExported() || name == "-" {
			continue
		}
		_, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if slices.Contains(strings.Split(opts, ","), "inline") {
			l, a := fileKeys(valueType(f.Type), prefix)
			leaves, all = append(leaves, l...), append(all, a...)
			continue
		}
		key := prefix + name
		all = append(all, key)
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		var sub string
		switch {
		case ft.Kind() == reflect.Struct:
			sub = key + "."
		case ft.Kind() == reflect.Slice && valueType(ft).Kind() == reflect.Struct:
			sub = key + "[]."
		case ft.Kind() == reflect.Map && valueType(ft).Kind() == reflect.Struct:
			sub = key + ".*."
		default:
			leaves = append(leaves, key)
			continue
		}
		l, a := fileKeys(valueType(ft), sub)
		leaves, all = append(leaves, l...), append(all, a...)
	}
	return leaves, all
}

// referenceSections are the sections of the reference that list a file's
// keys, with the type the loader decodes that file into. The catalog's and
// the plan's are unexported in package reports: each is one key, reports,
// holding a list of the exported entry type.
var referenceSections = []struct {
	heading string
	file    reflect.Type
}{
	{"## The worker config file", reflect.TypeFor[File]()},
	{"## The priorities file", reflect.TypeFor[reports.PrioritiesFile]()},
	{"## The report catalog", reflect.TypeFor[struct {
		Reports []reports.Report `yaml:"reports"`
	}]()},
	{"## The month-end plan", reflect.TypeFor[struct {
		Reports    []reports.PlanEntry `yaml:"reports"`
		OnComplete *reports.Step       `yaml:"on_complete"`
		OnFailure  *reports.Step       `yaml:"on_failure"`
	}]()},
}

// keyCell is the first cell of a table row that names a key: the whole
// key in backticks.
var keyCell = regexp.MustCompile("^\\| *`([^`]+)` *\\|")

// referenceKeys reads the keys each section of the reference lists: the
// first cell of its tables' rows, up to the next "## " heading.
func referenceKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string][]string{}
	at := map[string]int{} // section and key -> line
	section := ""
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if strings.HasPrefix(text, "## ") {
			section = text
			continue
		}
		if !strings.HasPrefix(text, "| `") {
			continue
		}
		m := keyCell.FindStringSubmatch(text)
		require.NotNilf(t, m, "%s:%d: the first cell of a key's row must be the one full key in backticks", path, line)
		prev, dup := at[section+" "+m[1]]
		require.Falsef(t, dup, "%s:%d: %s is listed twice (also line %d)", path, line, m[1], prev)
		at[section+" "+m[1]] = line
		out[section] = append(out[section], m[1])
	}
	require.NoError(t, sc.Err())
	return out
}

// The reference lists every key the loader accepts, and no key it
// refuses: a key added to a file's structs without a row in docs/CONFIG.md
// fails here, and so does a row for a key renamed or removed.
func TestConfigReference(t *testing.T) {
	t.Parallel()
	documented := referenceKeys(t, referencePath)
	for _, s := range referenceSections {
		t.Run(strings.TrimPrefix(s.heading, "## "), func(t *testing.T) {
			t.Parallel()
			keys, ok := documented[s.heading]
			require.Truef(t, ok, "%s has no section %q listing keys", referencePath, s.heading)
			leaves, all := fileKeys(s.file, "")
			var wrong []string
			for _, k := range leaves {
				if !slices.Contains(keys, k) {
					wrong = append(wrong, k+": the loader accepts it, the reference does not list it")
				}
			}
			for _, k := range keys {
				if !slices.Contains(all, k) {
					wrong = append(wrong, k+": the reference lists it, the loader refuses it")
				}
			}
			require.Emptyf(t, wrong, "%s, %q, differs from the loader:\n%s", referencePath, s.heading, strings.Join(wrong, "\n"))
		})
	}
}
