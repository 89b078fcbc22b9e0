package database

import (
	"errors"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// mask replaces a password; it is what url.URL.Redacted writes.
const mask = "xxxxx"

// notShown stands for a database URL that Redact cannot read well enough to
// be sure it hides every password.
const notShown = "(not a URL; not shown in case it holds a password)"

// scheme matches a URL scheme (RFC 3986).
var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// Redact returns a database URL fit for logs and messages: every password in
// it is replaced by xxxxx, whatever the input, including input that does not
// parse.
//
//   - A URL that url.Parse accepts and that pgx reads the same way has its
//     userinfo password masked, and the value of a password= or
//     sslpassword= query option with the options after it; the rest is as
//     given.
//   - A URL that does not parse, or that pgx and url.Parse might split
//     differently (Config.Problems names these), is masked by hand:
//     everything between "://" and the last "@" but the user name, the
//     value of a password option with all after it, and a non-numeric
//     port when there is no "@". This may hide more than the password.
//   - A key=value connection string (host=db password=... dbname=app) has
//     the values of password and sslpassword masked: a quoted value alone,
//     an unquoted one with all that follows it (it may have held a space),
//     and all that follows a part Redact cannot read.
//   - Anything else is replaced by a placeholder.
func Redact(raw string) string {
	if raw == "" {
		return ""
	}
	sch, rest, isURL := strings.Cut(raw, "://")
	if !isURL || !scheme.MatchString(sch) {
		if strings.Contains(raw, "=") {
			return redactKeyValue(raw)
		}
		return notShown
	}
	if u, err := url.Parse(raw); err == nil && urlAmbiguity(u, rest) == "" {
		u.RawQuery = redactQuery(u.RawQuery)
		return u.Redacted()
	}
	return sch + "://" + redactURLText(rest)
}

// urlProblem says what is wrong with a database URL, in words that quote
// none of it, or returns "" when it is a postgres:// URL that url.Parse and
// pgx read the same way. url.Parse's own errors are not used, as they quote
// the input, password and all.
func urlProblem(raw string) string {
	sch, rest, isURL := strings.Cut(raw, "://")
	if !isURL || !scheme.MatchString(sch) {
		if strings.Contains(raw, "=") {
			return "must be a postgres:// URL, not a key=value connection string"
		}
		return "must be a postgres:// URL"
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "is not a valid URL: " + parseProblem(err)
	}
	if a := urlAmbiguity(u, rest); a != "" {
		return "is ambiguous: " + a
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "must be a postgres:// URL"
	}
	return ""
}

// parseProblem says in words why url.Parse rejected a URL.
func parseProblem(err error) string {
	var escape url.EscapeError
	var host url.InvalidHostError
	msg := err.Error()
	switch {
	case errors.As(err, &escape):
		return `it has a "%" that is not followed by two hex digits; write "%" as %25, and percent-encode other special characters in a password`
	case errors.As(err, &host):
		return "its host has a character that is not allowed in a host name"
	case strings.Contains(msg, "invalid userinfo"):
		return `its user name or password has a character that must be percent-encoded (a space is %20)`
	case strings.Contains(msg, "invalid port"):
		return "its port is not a number"
	case strings.Contains(msg, "missing ']'"):
		return `its IPv6 host lacks the closing "]"`
	case strings.Contains(msg, "control character"):
		return "it has a control character, such as a newline, in it"
	default:
		return "it does not parse as a URL"
	}
}

// urlAmbiguity says why a URL that url.Parse accepts might hold a password
// outside its userinfo, or be split differently by pgx, which, like libpq,
// ends the userinfo at the first "@" before any "/" (url.Parse: at the last
// "@" before any "/", "?" or "#"). It returns "" for a clear URL: at most
// one "@", before the host and seen as such by url.Parse, no "#", and a
// query of key=value pairs. rest is what follows "://".
func urlAmbiguity(u *url.URL, rest string) string {
	authority := rest
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		authority = rest[:i]
	}
	switch n := strings.Count(authority, "@"); {
	case n > 1:
		return `it has more than one "@" before the host; write an "@" in the user name or password as %40`
	case n == 1 && u.User == nil:
		return `its user name or password has a "?" or "#"; write them as %3F and %23`
	case strings.Count(rest, "@") > n:
		// A password with a "/" in it puts the rest of itself after the
		// host, in the path or the query.
		return `it has an "@" after the host; write "/" in a password as %2F, and "@" elsewhere as %40`
	case strings.ContainsRune(rest, '#'):
		// url.Parse starts a fragment there; pgx reads on, so a password
		// option's value would run into the fragment.
		return `it has a "#"; write it as %23`
	case queryMalformed(u.RawQuery):
		return `its query has a part that is not one key=value; write "&" and "=" in a value as %26 and %3D`
	}
	return ""
}

// redactURLText masks, by hand, the passwords in what follows "://" in a URL
// that does not parse or is ambiguous: the userinfo up to the last "@" but
// a plain user name, the value of a password option and all after it (all
// after the "@" too if the option starts before it), and, when there is no
// "@", a port that is not a number.
func redactURLText(rest string) string {
	pv := passwordOption(rest)
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		if pv >= 0 {
			rest = rest[:pv] + mask
		}
		if strings.HasPrefix(rest, "[") {
			return rest
		}
		// No userinfo: a password typed without its "@" would be the port.
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if host, port, ok := strings.Cut(rest[:end], ":"); ok && strings.Trim(port, "0123456789") != "" {
			return host + ":" + mask + rest[end:]
		}
		return rest
	}
	var b strings.Builder
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if plainUser(user) {
		b.WriteString(user)
	} else {
		b.WriteString(mask)
	}
	if hasPassword {
		b.WriteString(":" + mask)
	}
	b.WriteByte('@')
	switch {
	case pv < 0:
		b.WriteString(rest[at+1:])
	case pv > at:
		b.WriteString(rest[at+1:pv] + mask)
	default: // the option's value may run on through the "@"
		b.WriteString(mask)
	}
	return b.String()
}

// passwordOption returns where the value of the first password or
// sslpassword option in s begins, or -1: the first "=" after a "?" or "&"
// whose key (percent-decoded) names one, or does not decode. It looks at
// every "?", not only the first, since in a URL that does not parse the
// query may begin anywhere.
func passwordOption(s string) int {
	for j := 0; j < len(s); j++ {
		if s[j] != '?' && s[j] != '&' {
			continue
		}
		eq := strings.IndexByte(s[j+1:], '=')
		if eq < 0 {
			return -1
		}
		k := s[j+1 : j+1+eq]
		if strings.ContainsAny(k, "?&") {
			continue
		}
		if dk, err := url.PathUnescape(k); err != nil || isPasswordKey(dk) {
			return j + 1 + eq + 1
		}
	}
	return -1
}

// plainUser reports whether s looks like nothing but a user name.
func plainUser(s string) bool {
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~%+-") == ""
}

// redactQuery masks the value of the first password or sslpassword option
// of a URL's query, whose keys pgx percent-decodes (pass%77ord is
// password), and drops the options after it: a password with a raw "&" in
// it runs on into what reads as more options. A key that does not decode
// counts as a password option.
func redactQuery(q string) string {
	parts := strings.Split(q, "&")
	for i, p := range parts {
		k, _, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		if dk, err := url.PathUnescape(k); err != nil || isPasswordKey(dk) {
			return strings.Join(append(parts[:i:i], k+"="+mask), "&")
		}
	}
	return q
}

// queryMalformed reports whether a URL's query has a part that is not one
// key=value pair. pgx rejects such a query, quoting the part, which may be
// a piece of a password that had a raw "&" in it.
func queryMalformed(q string) bool {
	for _, p := range strings.Split(q, "&") {
		if p != "" && strings.Count(p, "=") != 1 {
			return true
		}
	}
	return false
}

func isPasswordKey(k string) bool {
	return strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword")
}

func isSpace(c byte) bool { return strings.IndexByte(" \t\n\r\v\f", c) >= 0 }

// redactKeyValue masks the values of password and sslpassword in a
// key=value connection string, reading it as pgx and libpq do: a value is
// 'quoted' (with \' and \\ escapes) or runs to the next space (with \
// escapes). After an unquoted password, and after a part it cannot read,
// it masks the rest of the string as a whole, so that a password with a
// space in it (password=a b) is hidden entirely.
func redactKeyValue(s string) string {
	var b strings.Builder
	i := 0
	for {
		j := i
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		b.WriteString(s[i:j])
		i = j
		if i == len(s) {
			return b.String()
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			b.WriteString(mask)
			return b.String()
		}
		key := strings.TrimRight(s[i:i+eq], " \t\n\r\v\f")
		if key == "" || strings.ContainsAny(key, " \t\n\r\v\f") {
			b.WriteString(mask)
			return b.String()
		}
		j = i + eq + 1
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		b.WriteString(s[i:j])
		i = j
		end, quoted, ok := valueEnd(s, i)
		if !ok || (quoted && end < len(s) && !isSpace(s[end])) {
			// An unterminated quote, or a quote not followed by a space:
			// the rest might be more of the password.
			b.WriteString(mask)
			return b.String()
		}
		switch {
		case !isPasswordKey(key):
			b.WriteString(s[i:end])
		case quoted:
			b.WriteString("'" + mask + "'")
		default:
			// An unquoted value ends at a space, but a password typed
			// with a space in it runs on into what reads as more
			// options (password=a b=c), so the rest goes too.
			b.WriteString(mask)
			return b.String()
		}
		i = end
	}
}

// valueEnd returns where the value of a key=value pair that starts at i
// ends, whether it is quoted, and false if it cannot tell (an unterminated
// quote).
func valueEnd(s string, i int) (end int, quoted, ok bool) {
	if i < len(s) && s[i] == '\'' {
		for j := i + 1; j < len(s); j++ {
			switch s[j] {
			case '\\':
				j++
			case '\'':
				return j + 1, true, true
			}
		}
		return 0, true, false
	}
	j := i
	for j < len(s) && !isSpace(s[j]) {
		if s[j] == '\\' {
			j++
		}
		j++
	}
	return min(j, len(s)), false, true
}

// secrets returns the passwords a database URL or key=value connection
// string holds, as written and decoded, longest first, for scrubbing error
// texts that might quote them.
func secrets(raw string) []string {
	var out []string
	add := func(s string) {
		if s != "" && s != mask && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	addDecoded := func(s string) {
		add(s)
		if d, err := url.PathUnescape(s); err == nil {
			add(d)
		}
	}
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				addDecoded(pw)
			}
		}
		if u, err := url.Parse(raw); err == nil {
			if pw, ok := u.User.Password(); ok {
				add(pw)
			}
		}
		if _, q, ok := strings.Cut(rest, "?"); ok {
			for _, p := range strings.Split(q, "&") {
				if k, v, ok := strings.Cut(p, "="); ok {
					if dk, err := url.PathUnescape(k); err != nil || isPasswordKey(dk) {
						addDecoded(v)
					}
				}
			}
		}
	}
	// Key=value pairs, also inside a URL's text in case it is one.
	for i := 0; i < len(raw); {
		eq := strings.IndexByte(raw[i:], '=')
		if eq < 0 {
			break
		}
		key := raw[i : i+eq]
		if k := strings.LastIndexAny(key, " \t\n\r\v\f&?"); k >= 0 {
			key = key[k+1:]
		}
		j := i + eq + 1
		for j < len(raw) && isSpace(raw[j]) {
			j++
		}
		end, quoted, ok := valueEnd(raw, j)
		if !ok {
			end = len(raw)
		}
		if isPasswordKey(key) {
			v := raw[j:end]
			if quoted {
				v = strings.Trim(v, "'")
			}
			add(v)
			add(strings.NewReplacer(`\'`, `'`, `\\`, `\`, `\ `, ` `).Replace(v))
		}
		i = max(end, i+eq+1)
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// scrubbedError is an error whose text has had the passwords of a database
// URL cut out. It unwraps to the original error, for errors.Is and
// errors.As; the original's own text may still hold them.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrub returns err with every password of raw cut out of its text. The
// drivers quote a connection string only with its password masked, as far
// as we know; this makes sure.
func scrub(err error, raw string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := msg
	for _, s := range secrets(raw) {
		clean = strings.ReplaceAll(clean, s, mask)
	}
	if clean == msg {
		return err
	}
	return &scrubbedError{msg: clean, err: err}
}
