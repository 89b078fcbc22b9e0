// Package quote quotes values that came from input for messages, cut to a
// sane length, so that a huge or hostile value (a 10 MB report name in a
// job payload, say) cannot flood a log line, a terminal or the error stored
// with a job.
package quote

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Max is how many bytes of a value Value shows.
const Max = 80

// Value quotes s (Go syntax, so control characters show escaped), cut to
// Max bytes at a character boundary with its full length said.
func Value(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	cut := Max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}
