package yamlx_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
