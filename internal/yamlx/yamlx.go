// Package yamlx reads the project's YAML files strictly: unknown keys, a
// second document and an empty input are errors, so a typo in a config file
// stops the start instead of being ignored; a number with a fraction (2.9)
// or written as one (3.0, 1e3) for an integer field is an error too, where
// yaml alone would cut it to an integer without a word; a file larger than
// MaxFileSize is refused before it is read into memory; and an error never
// quotes the values of the document, so pointing a config at the wrong file
// (say /etc/passwd) does not print that file's content. The one exception
// is that number for an integer field: it is shown when it is a short plain
// number (digits, sign, point, exponent; at most 24 characters), which is
// what the user must find and which is not the content of a wrong file,
// and is otherwise called "the number".
package yamlx

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
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
// rejecting keys that out does not declare and numbers that are not written
// as integers for integer fields.
//
// Its errors keep the line and say what was found and what was expected
// ("line 1: a string where a mapping was expected"), or which key is
// unknown, but never quote a value of the document: yaml's own messages
// quote the start of the offending value, which for a file that is not the
// expected document at all is that file's content. A key is shown as
// written when it is a plain word, otherwise quoted and cut (quote.Value);
// a number for an integer field as the package comment says.
func DecodeStrict(data []byte, out any) error {
	problems, err := DecodeStrictAll(data, out)
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// DecodeStrictAll is DecodeStrict for callers that report every problem
// at once. When the only problems are unknown keys and numbers that are
// not integers for integer fields, it returns them, one message each with
// its line and key path, in the order of the document ("line 4: unknown
// key redis.colour (the keys here are ...)", "line 12: pools[2].size: 2.9
// is not a whole number"), and a nil error; out then holds everything
// else the document says, ready to be validated (such a number cut to an
// integer, as yaml does). Any other problem is the error, which lists
// those too.
func DecodeStrictAll(data []byte, out any) (problems []string, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var found []problem
	fatal := false
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty")
		}
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, rewrite(err, reflect.TypeOf(out), data)
		}
		fatal = !onlyUnknownKeys(te)
		for _, msg := range strings.Split(rewrite(err, reflect.TypeOf(out), data).Error(), "\n") {
			found = append(found, problem{line: lineOf(msg), msg: msg})
		}
	}
	found = append(found, notIntegers(data, reflect.TypeOf(out))...)
	slices.SortStableFunc(found, func(a, b problem) int { return cmp.Compare(a.line, b.line) })
	for _, p := range found {
		problems = append(problems, p.msg)
	}
	if fatal {
		return nil, errors.New(strings.Join(problems, "\n"))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, rewrite(err, nil, nil)
		}
		return nil, fmt.Errorf("line %d: a second YAML document is not allowed", extra.Line)
	}
	return problems, nil
}

// problem is one message of DecodeStrictAll with its line (0 when it has
// none), for sorting.
type problem struct {
	line int
	msg  string
}

// lineOf is the line a "line N: ..." message names, or 0.
func lineOf(msg string) int {
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
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

// EmptyKeys returns the key paths (pools[0].breaker) of the first
// document's keys that are written with no value, or with ~ or null, for
// a caller that gives "key:" a meaning of its own: yaml decodes it as if
// the key were left out. A document that does not parse has none.
func EmptyKeys(data []byte) map[string]bool {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	out := map[string]bool{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := keyText(n.Content[i].Value)
				if path != "" {
					p = path + "." + p
				}
				v := n.Content[i+1]
				if v.Kind == yaml.AliasNode && v.Alias != nil {
					v = v.Alias
				}
				if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
					out[p] = true
				}
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
	keys, _, _ := fields(deref(t))
	return keys
}

// fields lists the keys yaml reads into the struct type t (nil for any
// other type), in declaration order, with the type of each, by yaml's own
// rules (go.yaml.in/yaml/v3 getStructInfo): the name from the yaml tag, or
// the field's name in lower case; "-" and unexported fields skipped; the
// fields of an ",inline" struct as the struct's own. inlineMap is the
// value type of an ",inline" map, which takes every other key, or nil.
func fields(t reflect.Type) (keys []string, types map[string]reflect.Type, inlineMap reflect.Type) {
	if t.Kind() != reflect.Struct {
		return nil, nil, nil
	}
	types = map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "" && !strings.Contains(string(f.Tag), ":") {
			tag = string(f.Tag)
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") {
			if ft := deref(f.Type); ft.Kind() == reflect.Map {
				inlineMap = ft.Elem()
			} else {
				k, ty, m := fields(ft)
				keys = append(keys, k...)
				maps.Copy(types, ty)
				if m != nil {
					inlineMap = m
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		keys = append(keys, name)
		types[name] = f.Type
	}
	return keys, types, inlineMap
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
