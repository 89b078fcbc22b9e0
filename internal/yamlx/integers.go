package yamlx

import (
	"encoding"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxNumberText is the longest number a message shows as written.
const maxNumberText = 24

var (
	// plainNumberRE is a number as yaml resolves a plain float: digits
	// with an optional sign, point and exponent ("_" between digits), or
	// yaml's words for infinity and not-a-number.
	plainNumberRE   = regexp.MustCompile(`^[-+]?(\.[0-9][0-9_]*|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$`)
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// notIntegers finds the numbers of the document that yaml reads into an
// integer field of t although they are not written as integers: yaml takes
// 2.9 for an int as 2, and 3.0 or 1e3 as 3 or 1000, without a word. It
// returns one problem for each, with its line and key path:
//
//	line 12: pools[2].size: 2.9 is not a whole number
//	line 13: pools[2].max_backlog: 1e3 is not written as an integer (no decimal point or exponent)
//
// A number yaml refuses for the field (too large, not a number) is not
// listed here: yaml's own error says it. Durations are yaml's to check
// (they take only text such as 30s), and so is a type with its own
// UnmarshalYAML or UnmarshalText. The walk follows aliases as the decoder
// did before it, so it costs no more than the decode.
func notIntegers(data []byte, t reflect.Type) []problem {
	if t == nil {
		return nil
	}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	var out []problem
	var walk func(n *yaml.Node, t reflect.Type, path string)
	walk = func(n *yaml.Node, t reflect.Type, path string) {
		for n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		t = deref(t)
		if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) ||
			t.Implements(textType) || reflect.PointerTo(t).Implements(textType) {
			return
		}
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, t, path)
			}
		case yaml.ScalarNode:
			if msg, ok := notInteger(n, t); ok {
				out = append(out, problem{line: n.Line, msg: fmt.Sprintf("line %d: %s%s", n.Line, pathPrefix(path), msg)})
			}
		case yaml.SequenceNode:
			if t.Kind() != reflect.Slice && t.Kind() != reflect.Array {
				return
			}
			for i, c := range n.Content {
				walk(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
			}
		case yaml.MappingNode:
			_, types, inlineMap := fields(t)
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if k.ShortTag() == "!!merge" {
					// "<<: *base" (or "<<: [*a, *b]") sets the keys of
					// base here.
					for v.Kind == yaml.AliasNode && v.Alias != nil {
						v = v.Alias
					}
					if v.Kind == yaml.SequenceNode {
						for _, c := range v.Content {
							walk(c, t, path)
						}
					} else {
						walk(v, t, path)
					}
					continue
				}
				p := keyText(k.Value)
				if path != "" {
					p = path + "." + p
				}
				switch t.Kind() {
				case reflect.Map:
					walk(k, t.Key(), path)
					walk(v, t.Elem(), p)
				case reflect.Struct:
					if ft, ok := types[k.Value]; ok {
						walk(v, ft, p)
					} else if inlineMap != nil {
						walk(v, inlineMap, p)
					}
				}
			}
		}
	}
	walk(&root, t, "")
	return out
}

// notInteger says what is wrong with the scalar n for a value of type t,
// when t is an integer type and n is a number yaml would cut into it.
func notInteger(n *yaml.Node, t reflect.Type) (string, bool) {
	if t == durationType || n.ShortTag() != "!!float" {
		return "", false
	}
	var f float64
	if n.Decode(&f) != nil {
		return "", false
	}
	// The conditions under which yaml sets the field from the number
	// (go.yaml.in/yaml/v3 decode.go, scalar); otherwise yaml reports it.
	unsigned := false
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if !(f <= math.MaxInt64 && !reflect.Zero(t).OverflowInt(int64(f))) {
			return "", false
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if !(f <= math.MaxUint64 && !reflect.Zero(t).OverflowUint(uint64(f))) {
			return "", false
		}
		unsigned = true
	default:
		return "", false
	}
	text := "the number"
	if len(n.Value) <= maxNumberText && plainNumberRE.MatchString(n.Value) {
		text = n.Value
	}
	// Whether the number as written is whole: its float64 may round away
	// a fraction (1.00000000000000000001 is 1).
	whole, ok := wholeAsWritten(n.Value)
	if !ok {
		whole = !math.IsInf(f, 0) && !math.IsNaN(f) && f == math.Trunc(f)
	}
	switch {
	case unsigned && (f < 0 || math.IsNaN(f)):
		return text + " is not a whole number >= 0", true
	case !whole:
		return text + " is not a whole number", true
	}
	return text + " is not written as an integer (no decimal point or exponent)", true
}

// wholeAsWritten says whether the decimal number v (digits with an optional
// sign, point, "_" and exponent) is whole, from its digits: whether every
// digit right of the point, once the exponent has moved it, is 0. ok is
// false when v is not such a number or its exponent does not fit an int.
func wholeAsWritten(v string) (whole, ok bool) {
	v = strings.TrimLeft(strings.ReplaceAll(v, "_", ""), "+-")
	mant, exp := v, 0
	if i := strings.IndexAny(v, "eE"); i >= 0 {
		e, err := strconv.Atoi(v[i+1:])
		if err != nil {
			return false, false
		}
		mant, exp = v[:i], e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return false, false
	}
	if exp >= len(digits) {
		return true, true
	}
	point := len(intPart) + exp // digits[point:] are right of the point
	if point >= len(digits) {
		return true, true
	}
	return strings.Trim(digits[max(point, 0):], "0") == "", true
}

// pathPrefix is "path: ", or nothing for the document itself.
func pathPrefix(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
}
