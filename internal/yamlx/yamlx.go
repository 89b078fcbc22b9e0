// Package yamlx reads the project's YAML files strictly: unknown keys, a
// second document and an empty input are errors, so a typo in a config file
// stops the start instead of being ignored; a file larger than MaxFileSize
// is refused before it is read into memory; and an error never quotes the
// values of the document, so pointing a config at the wrong file (say
// /etc/passwd) does not print that file's content.
package yamlx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lci-labs/compartment/internal/quote"
)

// MaxFileSize is the largest file ReadFile accepts: far more than any
// config, priorities, catalog or plan file needs.
const MaxFileSize = 4 << 20

// ReadFile reads the file at path, refusing one larger than MaxFileSize
// (or a stream that never ends, such as /dev/zero) with an error that says
// the limit. It reads at most MaxFileSize+1 bytes whatever the file.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s is larger than the limit of %d MiB: is it the right file?", path, MaxFileSize>>20)
	}
	return data, nil
}

// DecodeStrict decodes exactly one YAML document from data into out,
// rejecting keys that out does not declare.
//
// Its errors keep the line and say what was found and what was expected
// ("line 1: a string where a mapping was expected"), or which key is
// unknown, but never quote a value of the document: yaml's own messages
// quote the start of the offending value, which for a file that is not the
// expected document at all is that file's content. A key is shown as
// written when it is a plain word, otherwise quoted and cut (quote.Value).
func DecodeStrict(data []byte, out any) error {
	unknown, err := DecodeStrictAll(data, out)
	if err != nil {
		return err
	}
	if len(unknown) > 0 {
		return errors.New(strings.Join(unknown, "\n"))
	}
	return nil
}

// DecodeStrictAll is DecodeStrict for callers that report every problem
// at once: when the only problems are unknown keys, it returns them, one
// message each with its line and key path ("line 4: unknown key
// redis.colour (the keys here are ...)"), and a nil error, and out holds
// everything else the document says, ready to be validated. Any other
// problem is the error.
func DecodeStrictAll(data []byte, out any) (unknownKeys []string, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty")
		}
		var te *yaml.TypeError
		if errors.As(err, &te) && onlyUnknownKeys(te) {
			unknownKeys = strings.Split(rewrite(err, reflect.TypeOf(out), data).Error(), "\n")
		} else {
			return nil, rewrite(err, reflect.TypeOf(out), data)
		}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, rewrite(err, nil, nil)
		}
		return nil, fmt.Errorf("line %d: a second YAML document is not allowed", extra.Line)
	}
	return unknownKeys, nil
}

// onlyUnknownKeys reports whether every entry of te is an unknown key.
func onlyUnknownKeys(te *yaml.TypeError) bool {
	for _, e := range te.Errors {
		m := lineRE.FindStringSubmatch(e)
		if m == nil {
			return false
		}
		rest := e[len(m[0]):]
		if !strings.HasPrefix(rest, "field ") || !strings.Contains(rest, notFoundInfix) {
			return false
		}
	}
	return true
}

// keyPaths maps each line of the document to the dotted paths of the
// mapping keys on it (pools[1].colour), for messages in the document's own
// words.
func keyPaths(data []byte) map[int][]string {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	out := map[int][]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				p := keyText(k.Value)
				if path != "" {
					p = path + "." + p
				}
				out[k.Line] = append(out[k.Line], p)
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	walk(&root, "")
	return out
}

// rewrite returns err from the yaml decoder in words that do not quote the
// document's values. root is the type decoded into (nil when unknown);
// data, when not nil, names unknown keys by their path.
func rewrite(err error, root reflect.Type, data []byte) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return errors.New(rewriteOther(err.Error()))
	}
	types := map[string]reflect.Type{}
	collectTypes(root, types)
	var top reflect.Type
	if root != nil {
		top = deref(root)
	}
	var paths map[int][]string
	if data != nil {
		paths = keyPaths(data)
	}
	lines := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		lines[i] = rewriteTypeError(e, types, top, paths)
	}
	return errors.New(strings.Join(lines, "\n"))
}

var (
	lineRE        = regexp.MustCompile(`^line (\d+): `)
	backquotedRE  = regexp.MustCompile("(?s)`.*?`")
	durationType  = reflect.TypeFor[time.Duration]()
	plainKeyRE    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	notFoundInfix = " not found in type "
)

// rewriteTypeError rewrites one entry of a *yaml.TypeError. The entries
// come from yaml's decoder in these forms (go.yaml.in/yaml/v3 decode.go):
//
//	line N: cannot unmarshal TAG `VALUE` into TYPE
//	line N: field KEY not found in type TYPE
//	line N: mapping key "KEY" already defined at line M
//	line N: field KEY already set in type TYPE
func rewriteTypeError(e string, types map[string]reflect.Type, top reflect.Type, paths map[int][]string) string {
	m := lineRE.FindStringSubmatch(e)
	if m == nil {
		return stripValues(e)
	}
	prefix, rest := m[0], e[len(m[0]):]
	switch {
	case strings.HasPrefix(rest, "cannot unmarshal "):
		into := strings.LastIndex(rest, " into ")
		if into < 0 {
			return prefix + "a value of the wrong kind"
		}
		tag, _, _ := strings.Cut(rest[len("cannot unmarshal "):], " ")
		typeName := rest[into+len(" into "):]
		msg := prefix + found(tag)
		t, ok := types[typeName]
		if !ok {
			return msg + " where a value of type " + typeName + " was expected"
		}
		msg += " where " + expected(t) + " was expected"
		if deref(t) == top && top != nil {
			msg += " (is it the right file?)"
		}
		return msg

	case strings.HasPrefix(rest, "field ") && strings.Contains(rest, notFoundInfix):
		at := strings.LastIndex(rest, notFoundInfix)
		key := rest[len("field "):at]
		name := keyText(key)
		line, _ := strconv.Atoi(m[1])
		for _, p := range paths[line] {
			if p == name || strings.HasSuffix(p, "."+name) {
				name = p
				break
			}
		}
		msg := prefix + "unknown key " + name
		if known := knownKeys(types[rest[at+len(notFoundInfix):]]); len(known) > 0 {
			msg += " (the keys here are " + strings.Join(known, ", ") + ")"
		}
		return msg

	case strings.HasPrefix(rest, "mapping key "):
		var key, line string
		if k, l, ok := strings.Cut(rest[len("mapping key "):], " already defined at line "); ok {
			if uq, err := strconv.Unquote(k); err == nil {
				key, line = uq, l
			}
		}
		if line == "" {
			return prefix + "a key is defined twice"
		}
		return prefix + "key " + keyText(key) + " is already defined at line " + line

	case strings.HasPrefix(rest, "field ") && strings.Contains(rest, " already set in type "):
		key := rest[len("field "):strings.LastIndex(rest, " already set in type ")]
		return prefix + "key " + keyText(key) + " is set twice"
	}
	return stripValues(e)
}

// rewriteOther rewrites the yaml errors that are not a *yaml.TypeError:
// the parser's and scanner's (fixed texts, "yaml: line N: did not find
// expected key", kept as they are) and the few that quote the document.
func rewriteOther(msg string) string {
	switch {
	case strings.HasPrefix(msg, "yaml: cannot decode "):
		// "cannot decode !!float `1.5` as a !!int", from an explicit tag.
		f := strings.Fields(msg)
		if len(f) < 7 {
			return "yaml: a value's explicit tag does not fit the value"
		}
		return fmt.Sprintf("yaml: a value tagged %s cannot be decoded as %s", tagText(f[3]), tagText(f[len(f)-1]))
	case strings.HasPrefix(msg, "yaml: unknown anchor "):
		return "yaml: an alias refers to an anchor that is not defined"
	case strings.HasPrefix(msg, "yaml: anchor ") && strings.HasSuffix(msg, " value contains itself"):
		return "yaml: an anchor's value contains an alias to itself"
	case strings.HasPrefix(msg, "yaml: invalid map key: "):
		return "yaml: a mapping or sequence is used as a key"
	}
	return stripValues(msg)
}

// stripValues removes `quoted` values from a message this package does not
// know, as a safety net, and cuts it.
func stripValues(msg string) string {
	msg = backquotedRE.ReplaceAllString(msg, "(value not shown)")
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return msg
}

// found describes what the document has, from yaml's short tag.
func found(tag string) string {
	switch tag {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "an empty value"
	case "!!timestamp":
		return "a timestamp"
	case "!!binary":
		return "binary data"
	case "!!map":
		return "a mapping"
	case "!!seq":
		return "a sequence"
	}
	return "a value tagged " + tagText(tag)
}

// tagText shows a yaml tag: the standard ones as they are, any other (the
// document's own, so input) not at all.
func tagText(tag string) string {
	switch tag {
	case "!!str", "!!int", "!!float", "!!bool", "!!null", "!!timestamp", "!!binary", "!!map", "!!seq", "!!merge":
		return tag
	}
	return "with a custom tag"
}

// expected describes what a value of type t must be written as.
func expected(t reflect.Type) string {
	t = deref(t)
	if t == durationType {
		return "a duration such as 30s or 1m30s"
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.Slice, reflect.Array:
		return "a sequence"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "an integer >= 0"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a value of type " + t.String()
}

// keyText shows a key of the document: as written when it is a plain
// word, otherwise quoted and cut.
func keyText(k string) string {
	if plainKeyRE.MatchString(k) {
		return k
	}
	return quote.Value(k)
}

// knownKeys lists the yaml keys of a struct type, in declaration order.
func knownKeys(t reflect.Type) []string {
	if t == nil {
		return nil
	}
	t = deref(t)
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") {
			out = append(out, knownKeys(f.Type)...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out = append(out, name)
	}
	return out
}

// collectTypes records t and every type reachable from it by name
// (reflect.Type.String, which yaml's messages use).
func collectTypes(t reflect.Type, into map[string]reflect.Type) {
	if t == nil {
		return
	}
	if _, seen := into[t.String()]; seen {
		return
	}
	into[t.String()] = t
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		collectTypes(t.Elem(), into)
	case reflect.Map:
		collectTypes(t.Key(), into)
		collectTypes(t.Elem(), into)
	case reflect.Struct:
		for f := range t.Fields() {
			if f.IsExported() {
				collectTypes(f.Type, into)
			}
		}
	}
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}
