package database_test

import (
	"strings"
	"testing"

	"github.com/lci-labs/compartment/internal/database"
)

// FuzzRedact puts arbitrary passwords where a password goes in each form
// of connection string, and checks that Redact shows no part of them. The
// password is interleaved with LEAK (p/w becomes LEAKpLEAK/LEAKwLEAK), and
// no other text here has an uppercase E, A or K, so any two characters of
// it that survive show up.
func FuzzRedact(f *testing.F) {
	for _, seed := range []string{"pw", "s3c%zz", "a b", "a@b", "a/b@c", "12/x", "x?y", "x#y", "'", `\`, "a' k=v", "\n", "[", "]:1", "%40", "&0", "@#", "?%=", "@/"} {
		f.Add(seed)
	}
	templates := []string{
		"postgres://u:%s@127.0.0.1:5432/x",
		"postgres://u:%s@127.0.0.1:5432/x?sslmode=disable",
		"postgresql://u:%s@[::1]:5432/x",
		"postgres://u@127.0.0.1:5432/x?a=b&password=%s&c=d",
		"postgres://u@127.0.0.1:5432/x?sslpassword=%s",
		"host=127.0.0.1 password=%s dbname=x",
		"host=127.0.0.1 password='%s' dbname=x",
		"password = %s",
	}
	f.Fuzz(func(t *testing.T, pw string) {
		var b strings.Builder
		b.WriteString("LEAK")
		for _, r := range pw {
			b.WriteRune(r)
			b.WriteString("LEAK")
		}
		for _, tmpl := range templates {
			raw := strings.Replace(tmpl, "%s", b.String(), 1)
			if got := database.Redact(raw); strings.ContainsAny(got, "EAK") {
				t.Fatalf("Redact(%q) = %q shows the password", raw, got)
			}
		}
	})
}
