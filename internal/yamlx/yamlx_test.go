package yamlx_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/lci-labs/compartment/internal/yamlx"
)

type sub struct {
	Host string `yaml:"host"`
}

type doc struct {
	Name    string            `yaml:"name"`
	Size    int               `yaml:"size,omitempty"`
	Timeout time.Duration     `yaml:"timeout,omitempty"`
	Items   []string          `yaml:"items"`
	Sub     sub               `yaml:"sub"`
	Labels  map[string]string `yaml:"labels"`
	Enabled bool              `yaml:"enabled"`
}

// TestDecodeStrictDoesNotEchoValues: a file that is not the expected
// document, or a value of the wrong kind, is reported by line and kind,
// never by its content (yaml's own messages quote the value's start).
func TestDecodeStrictDoesNotEchoValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, yaml string
		want       string
	}{
		{"passwd line instead of a mapping", "root:x:0:0:SECRETLINE\n",
			"line 1: a string where a mapping was expected (is it the right file?)"},
		{"passwd file instead of a mapping", "root:x:0:0:root:/root:/bin/bash\nSECRETLINE:x:1:1::/:/bin/sh\n",
			"line 1: a string where a mapping was expected (is it the right file?)"},
		{"short value instead of a mapping", "SECRETLINE\n",
			"line 1: a string where a mapping was expected (is it the right file?)"},
		{"sequence instead of a mapping", "- SECRETLINE\n",
			"line 1: a sequence where a mapping was expected (is it the right file?)"},
		{"string for an integer", "name: a\nsize: SECRETLINE\n",
			"line 2: a string where an integer was expected"},
		{"number for a mapping", "sub: 12345SECRETLINE\n",
			"line 1: a string where a mapping was expected"},
		{"integer for a sequence", "items: 42\n",
			"line 1: an integer where a sequence was expected"},
		{"string for a duration", "timeout: SECRETLINE\n",
			"line 1: a string where a duration such as 30s or 1m30s was expected"},
		{"string for a boolean", "enabled: SECRETLINE\n",
			"line 1: a string where true or false was expected"},
		{"sequence for a string", "sub:\n  host: [SECRETLINE]\n",
			"line 2: a sequence where a string was expected"},
		{"custom tag", "name: !SECRETLINE {a: 1}\n",
			"line 1: a value tagged with a custom tag where a string was expected"},
		{"explicit tag that does not fit", "size: !!int SECRETLINE\n",
			"yaml: a value tagged !!str cannot be decoded as !!int"},
		{"unknown anchor", "name: *SECRETLINE\n",
			"yaml: an alias refers to an anchor that is not defined"},
		{"two errors", "size: SECRETLINE\nitems: SECRETLINE\n",
			"line 1: a string where an integer was expected\nline 2: a string where a sequence was expected"},
		{"malformed yaml keeps the parser's words", "items: [SECRETLINE\n",
			"yaml: line 1: did not find expected ',' or ']'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := yamlx.DecodeStrict([]byte(tc.yaml), &d)
			require.Error(t, err)
			require.Equal(t, tc.want, err.Error())
			require.NotContains(t, err.Error(), "SECRET")
			require.NotContains(t, err.Error(), "root:")
		})
	}
}

// TestDecodeStrictKeys: unknown and repeated keys are named (a key is not
// a secret, and the user must find it), with the keys that are allowed
// instead of the Go type's name.
func TestDecodeStrictKeys(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, yaml string
		want       string
	}{
		{"unknown key", "name: a\ncolour: red\n",
			"line 2: unknown key colour (the keys here are name, size, timeout, items, sub, labels, enabled)"},
		{"unknown nested key", "sub:\n  host: h\n  port: 1\n",
			"line 3: unknown key sub.port (the keys here are host)"},
		{"unknown key that is not a plain word", "\"a b\\x01\": 1\n",
			`line 1: unknown key "a b\x01" (the keys here are name, size, timeout, items, sub, labels, enabled)`},
		{"repeated key", "name: a\nname: b\n",
			"line 2: key name is already defined at line 1"},
		{"repeated map key", "labels:\n  x y: a\n  x y: b\n",
			`line 3: key "x y" is already defined at line 2`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := yamlx.DecodeStrict([]byte(tc.yaml), &d)
			require.Error(t, err)
			require.Equal(t, tc.want, err.Error())
			require.NotContains(t, err.Error(), "yamlx_test.")
		})
	}
}

// TestDecodeStrictHugeKey: a long key is cut in the message.
func TestDecodeStrictHugeKey(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("k", 100_000)
	var d doc
	// An explicit key ("? "), since yaml limits a plain key to 1024 bytes.
	err := yamlx.DecodeStrict([]byte("? "+key+"\n: 1\n"), &d)
	require.Error(t, err)
	require.Less(t, len(err.Error()), 300)
	require.Contains(t, err.Error(), "line 1: unknown key \"kkkk")
	require.Contains(t, err.Error(), "(100000 bytes) (the keys here are")
}

func TestDecodeStrictDocuments(t *testing.T) {
	t.Parallel()
	var d doc
	require.EqualError(t, yamlx.DecodeStrict(nil, &d), "the file is empty")
	require.EqualError(t, yamlx.DecodeStrict([]byte("name: a\n---\nname: SECRETLINE\n"), &d), "line 2: a second YAML document is not allowed")
	err := yamlx.DecodeStrict([]byte("name: a\n---\n[SECRETLINE\n"), &d)
	require.ErrorContains(t, err, "did not find expected ',' or ']'")
	require.NotContains(t, err.Error(), "SECRET")
	require.NoError(t, yamlx.DecodeStrict([]byte("name: a\nsize: 2\ntimeout: 1m\nitems: [x]\nsub: {host: h}\nlabels: {a: b}\nenabled: true\n"), &d))
	require.Equal(t, doc{Name: "a", Size: 2, Timeout: time.Minute, Items: []string{"x"}, Sub: sub{Host: "h"}, Labels: map[string]string{"a": "b"}, Enabled: true}, d)
}

func TestReadFileLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exact := filepath.Join(dir, "exact.yaml")
	require.NoError(t, os.WriteFile(exact, make([]byte, yamlx.MaxFileSize), 0o600))
	data, err := yamlx.ReadFile(exact)
	require.NoError(t, err)
	require.Len(t, data, yamlx.MaxFileSize)

	over := filepath.Join(dir, "over.yaml")
	require.NoError(t, os.WriteFile(over, make([]byte, yamlx.MaxFileSize+1), 0o600))
	_, err = yamlx.ReadFile(over)
	require.EqualError(t, err, over+" is larger than the limit of 4 MiB: is it the right file?")

	if _, err := os.Stat("/dev/zero"); err == nil {
		_, err = yamlx.ReadFile("/dev/zero")
		require.EqualError(t, err, "/dev/zero is larger than the limit of 4 MiB: is it the right file?")
	}
}

// FuzzDecodeStrict: whatever the input, DecodeStrict does not panic, and
// no line of its error is long enough to carry more than a cut value.
func FuzzDecodeStrict(f *testing.F) {
	f.Add([]byte("name: a\nsize: 2\nsub: {host: h}\n"))
	f.Add([]byte("root:x:0:0:root:/root:/bin/bash\n"))
	f.Add([]byte("size: !!int abc\nname: *x\ncolour: red\n"))
	f.Add([]byte("name: a\nname: b\nlabels: {a: 1, a: 2}\n"))
	f.Add([]byte("? [a, b]\n: 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var d doc
		err := yamlx.DecodeStrict(data, &d)
		if err == nil {
			return
		}
		for _, line := range strings.Split(err.Error(), "\n") {
			if len(line) > 300 {
				t.Fatalf("error line of %d bytes: %.300s", len(line), line)
			}
		}
	})
}

// numbers has an integer field of each shape yaml reads one into.
type numbers struct {
	N       int                      `yaml:"n"`
	Small   int8                     `yaml:"small"`
	U       uint                     `yaml:"u"`
	P       *int                     `yaml:"p"`
	F       float64                  `yaml:"f"`
	D       time.Duration            `yaml:"d"`
	M       map[string]int           `yaml:"m"`
	Waits   map[string]time.Duration `yaml:"waits"`
	L       []int                    `yaml:"l"`
	Items   []numbersItem            `yaml:"items"`
	Name    string                   `yaml:"name"`
	Written unwrittenInt             `yaml:"custom"`
}

type numbersItem struct {
	Name  string `yaml:"name"`
	Size  int    `yaml:"size"`
	inner `yaml:",inline"`
}

type inner struct {
	Limit int `yaml:"limit"`
}

// unwrittenInt decodes itself: how it reads a number is its own business.
type unwrittenInt int

func (u *unwrittenInt) UnmarshalYAML(n *yaml.Node) error {
	var f float64
	if err := n.Decode(&f); err != nil {
		return err
	}
	*u = unwrittenInt(f)
	return nil
}

// integerCases are documents for numbers, with the problems DecodeStrictAll
// returns for them (none: accepted). They seed FuzzIntegers too.
var integerCases = []struct {
	name, yaml string
	want       []string
}{
	{"integers", "n: 3\nsmall: -128\nu: 7\np: 0\nm: {a: 1}\nl: [1, 2]\nitems: [{size: 2, limit: 5}]\n", nil},
	{"integer forms yaml knows", "n: 0x1F\nu: 0o17\np: 1_000\n", nil},
	{"a number with a fraction for a float", "f: 2.9\n", nil},
	{"durations are text", "d: 1m30s\nwaits: {a: 10s}\n", nil},
	{"a type that decodes itself", "custom: 2.9\n", nil},
	{"fraction", "n: 2.9\n", []string{"line 1: n: 2.9 is not a whole number"}},
	{"negative fraction", "n: -0.5\n", []string{"line 1: n: -0.5 is not a whole number"}},
	{"whole number written with a point", "n: 3.0\n", []string{"line 1: n: 3.0 is not written as an integer (no decimal point or exponent)"}},
	{"exponent", "n: 1e3\n", []string{"line 1: n: 1e3 is not written as an integer (no decimal point or exponent)"}},
	{"fraction with an exponent", "n: 25e-1\n", []string{"line 1: n: 25e-1 is not a whole number"}},
	{"whole with a point and an exponent", "n: 1.50e1\n", []string{"line 1: n: 1.50e1 is not written as an integer (no decimal point or exponent)"}},
	{"whole with a negative exponent", "n: +2500e-2\n", []string{"line 1: n: +2500e-2 is not written as an integer (no decimal point or exponent)"}},
	{"fraction with underscores", "n: 1_0.0_5\n", []string{"line 1: n: 1_0.0_5 is not a whole number"}},
	{"zero with a huge exponent", "n: 0.0e999999999999999999999\n", []string{"line 1: n: the number is not written as an integer (no decimal point or exponent)"}},
	{"fraction below the float's precision", "n: 1.00000000000000000001\n", []string{"line 1: n: 1.00000000000000000001 is not a whole number"}},
	{"minus infinity", "n: -.inf\n", []string{"line 1: n: -.inf is not a whole number"}},
	{"pointer", "p: 1.99\n", []string{"line 1: p: 1.99 is not a whole number"}},
	{"unsigned", "u: 1.5\n", []string{"line 1: u: 1.5 is not a whole number"}},
	{"negative for an unsigned", "u: -2.0\n", []string{"line 1: u: -2.0 is not a whole number >= 0"}},
	{"small integer", "small: 2.5\n", []string{"line 1: small: 2.5 is not a whole number"}},
	{"explicit tag", "n: !!float 4\n", []string{"line 1: n: 4 is not written as an integer (no decimal point or exponent)"}},
	{"map value", "m:\n  a: 1\n  b c: 2.7\n", []string{`line 3: m."b c": 2.7 is not a whole number`}},
	{"list", "l: [1, 2.5, 3]\n", []string{"line 1: l[1]: 2.5 is not a whole number"}},
	{"nested", "items:\n  - name: a\n    size: 2\n  - name: b\n    size: 2.9\n", []string{"line 5: items[1].size: 2.9 is not a whole number"}},
	{"inline struct", "items:\n  - limit: 2.7\n", []string{"line 2: items[0].limit: 2.7 is not a whole number"}},
	{"alias", "n: &x 2.5\nl: [*x]\n", []string{"line 1: n: 2.5 is not a whole number", "line 1: l[0]: 2.5 is not a whole number"}},
	// The anchor's holder is not a key of the type, so it is an unknown
	// key; the merged number is named where it is merged.
	{"merge", "base: &b {size: 1.5}\nitems:\n  - <<: *b\n    name: a\n", []string{
		"line 1: unknown key base (the keys here are n, small, u, p, f, d, m, waits, l, items, name, custom)",
		"line 1: items[0].size: 1.5 is not a whole number",
	}},
	{"long number not shown", "n: 1.00000000000000000000000000001\n", []string{"line 1: n: the number is not a whole number"}},
	{"with the unknown keys, in line order", "colour: red\nn: 2.5\nitems:\n  - size: 0.5\n    port: 1\n",
		[]string{
			"line 1: unknown key colour (the keys here are n, small, u, p, f, d, m, waits, l, items, name, custom)",
			"line 2: n: 2.5 is not a whole number",
			"line 4: items[0].size: 0.5 is not a whole number",
			"line 5: unknown key items[0].port (the keys here are name, size, limit)",
		}},
}

// TestDecodeStrictIntegers: a number yaml would cut into an integer field
// is a problem naming its line and key path, listed with the unknown keys;
// the number is shown when it is a short plain number.
func TestDecodeStrictIntegers(t *testing.T) {
	t.Parallel()
	for _, tc := range integerCases {
		t.Run(tc.name, func(t *testing.T) {
			var n numbers
			problems, err := yamlx.DecodeStrictAll([]byte(tc.yaml), &n)
			require.NoError(t, err)
			require.Equal(t, tc.want, problems)
		})
	}

	t.Run("with an error, all of them in the error", func(t *testing.T) {
		var n numbers
		problems, err := yamlx.DecodeStrictAll([]byte("n: 2.5\nname: [x]\nl: [0.5]\n"), &n)
		require.Nil(t, problems)
		require.EqualError(t, err, "line 1: n: 2.5 is not a whole number\nline 2: a sequence where a string was expected\nline 3: l[0]: 0.5 is not a whole number")
	})
	t.Run("DecodeStrict", func(t *testing.T) {
		var n numbers
		require.EqualError(t, yamlx.DecodeStrict([]byte("n: 1\nitems: [{size: 2.9}]\n"), &n), "line 2: items[0].size: 2.9 is not a whole number")
	})
	t.Run("a number yaml refuses is said once", func(t *testing.T) {
		var n numbers
		require.EqualError(t, yamlx.DecodeStrict([]byte("small: 300.5\n"), &n), "line 1: a number where an integer was expected")
		require.EqualError(t, yamlx.DecodeStrict([]byte("n: .nan\n"), &n), "line 1: a number where an integer was expected")
	})
}

// FuzzIntegers: whatever the document, DecodeStrictAll does not panic, and
// when it finds no problem, every integer it set is the number the document
// wrote (read loosely, with no type to cut it into).
func FuzzIntegers(f *testing.F) {
	for _, tc := range integerCases {
		f.Add([]byte(tc.yaml))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var n numbers
		problems, err := yamlx.DecodeStrictAll(data, &n)
		if err != nil || len(problems) > 0 {
			return
		}
		var loose map[string]any
		if yaml.Unmarshal(data, &loose) != nil {
			return
		}
		same := func(key string, got int64, written any) {
			t.Helper()
			switch w := written.(type) {
			case int:
				if int64(w) != got {
					t.Fatalf("%s: wrote %d, got %d", key, w, got)
				}
			case float64:
				t.Fatalf("%s: %v accepted for an integer field (set to %d)", key, w, got)
			}
		}
		if w, ok := loose["n"]; ok {
			same("n", int64(n.N), w)
		}
		if w, ok := loose["p"]; ok && n.P != nil {
			same("p", int64(*n.P), w)
		}
		if l, ok := loose["l"].([]any); ok && len(l) == len(n.L) {
			for i, w := range l {
				same("l", int64(n.L[i]), w)
			}
		}
		if m, ok := loose["m"].(map[string]any); ok {
			for k, w := range m {
				same("m."+k, int64(n.M[k]), w)
			}
		}
	})
}

func TestEmptyKeys(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string]bool{"a": true, "b.c": true, "l[1].d": true, "e": true, "f": true},
		yamlx.EmptyKeys([]byte("a:\nb:\n  c: ~\nl:\n  - {d: 1}\n  - {d: null}\ne: &x\nf: *x\ng: {}\nh: ''\ni: [~]\n")))
	require.Empty(t, yamlx.EmptyKeys([]byte("a: 1\n")))
	require.Nil(t, yamlx.EmptyKeys([]byte("a: [\n")))
}
