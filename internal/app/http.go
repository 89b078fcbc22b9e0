package app

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
)

// MinTokenLength is the shortest token http.token_file may hold.
const MinTokenLength = 16

// maxTokenFile bounds what is read of http.token_file: a token is a line,
// and a path to the wrong file (or to /dev/zero) must not stall the start.
const maxTokenFile = 4 << 10

// HTTPConfig is the worker's optional HTTP listener: metrics, health
// probes, the status API and the dashboard (package internal/web).
type HTTPConfig struct {
	// Listen is the host:port the listener binds, such as 127.0.0.1:8080;
	// the worker's -http flag overrides it. A reload cannot change it
	// (restart the worker). Defaults to "": no listener.
	Listen string `yaml:"listen,omitempty"`
	// TokenFile is the path (relative to the config file) of a file
	// holding the token the dashboard's actions (pause, resume, retry,
	// breaker, cancel-run) need. A reload (SIGHUP) reads it again, and a
	// running listener rereads it on its own (Worker.ReloadToken), so a
	// rotated token, a Kubernetes Secret's for one, takes effect without
	// a restart. Defaults to "": the dashboard is read-only.
	TokenFile string `yaml:"token_file,omitempty"`

	// Token is the token read from TokenFile, surrounding white space
	// trimmed. It is never logged nor printed.
	Token string `yaml:"-"`
}

// CheckListen checks a listen address: host:port with a port number
// (0 picks a free port). An empty host binds every interface.
func CheckListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (for example 127.0.0.1:8080): %v", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: port must be a number from 0 to 65535", addr)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("%q: bad host %q", addr, host)
	}
	return nil
}

// load reads the token file (path relative to the config file at cfgPath)
// and returns the problems of the section. A problem never quotes the
// token.
func (h *HTTPConfig) load(cfgPath string) []string {
	var out []string
	if h.Listen != "" {
		if err := CheckListen(h.Listen); err != nil {
			out = append(out, "http.listen: "+err.Error())
		}
	}
	if h.TokenFile == "" {
		return out
	}
	token, err := readToken(relativeTo(cfgPath, h.TokenFile))
	if err != nil {
		out = append(out, err.Error())
	}
	h.Token = ""
	if out == nil {
		h.Token = token
	}
	return out
}

// readToken reads and checks the token file at path. Its error names the
// key and the file, never the token.
func readToken(path string) (string, error) {
	data, err := readSmall(path, maxTokenFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("http.token_file: %s does not exist (write a random token into it, e.g. openssl rand -hex 24 > %s)", path, path)
	case err != nil:
		return "", fmt.Errorf("http.token_file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	switch {
	case token == "":
		return "", fmt.Errorf("http.token_file: %s is empty", path)
	case len(token) < MinTokenLength || strings.ContainsAny(token, " \t\r\n"):
		return "", fmt.Errorf("http.token_file: the token in %s must be one word of at least %d characters", path, MinTokenLength)
	}
	return token, nil
}

// readSmall reads the file at path, refusing one longer than limit bytes
// without reading past it.
func readSmall(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is longer than %d bytes: is it the right file?", path, limit)
	}
	return data, nil
}
