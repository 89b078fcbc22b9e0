package web_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/web"
)

// cutWithin is how soon the listener must close a connection whose body
// trickles in: the bound, with web.ActionBodyTimeout (5 s) under it.
const cutWithin = 10 * time.Second

// trickle is a raw connection that sent a request's headers and then
// sends its body one byte at a time, as a slow or hostile client does.
type trickle struct {
	conn   net.Conn
	opened time.Time

	done   chan struct{} // closed when the server has closed the connection
	status string        // the answer's status line, if one came
	closed time.Time     // when the server closed it
}

// startTrickle opens a connection to addr, sends a POST to path with the
// extra header lines, declaring contentLength, then one byte of body every
// every, until the server closes the connection.
func startTrickle(t *testing.T, addr, path string, contentLength int, every time.Duration, header ...string) *trickle {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n", path, addr, contentLength)
	for _, h := range header {
		head += h + "\r\n"
	}
	_, err = io.WriteString(conn, head+"\r\n")
	require.NoError(t, err)
	tr := &trickle{conn: conn, opened: time.Now(), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		br := bufio.NewReader(conn)
		line, _ := br.ReadString('\n')
		_, _ = io.Copy(io.Discard, br) // until the server closes it (EOF or reset)
		tr.status, tr.closed = strings.TrimSpace(line), time.Now()
	}()
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for range contentLength {
			select {
			case <-tr.done:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	return tr
}

// wait waits for the server to close the connection, failing the test if
// it does not within cutWithin of the request, and returns the answer's
// status line.
func (tr *trickle) wait(t *testing.T) string {
	t.Helper()
	select {
	case <-tr.done:
	case <-time.After(time.Until(tr.opened.Add(cutWithin))):
		t.Fatalf("the connection was still open %s after the request's headers", cutWithin)
	}
	require.Less(t, tr.closed.Sub(tr.opened), cutWithin)
	return tr.status
}

// A client that sends its body slowly, or announces a big one, is cut
// within 10 s, before anything is done: the token is checked before the
// body is read, the body is bounded in size and in time.
func TestSlowOrBigBodyIsCut(t *testing.T) {
	t.Parallel()
	s := newStack(t, testToken)
	addr := strings.TrimPrefix(s.url, "http://")
	cases := []struct {
		name          string
		contentLength int
		header        []string
		status        string
	}{
		// The request: no token, 100000 bytes announced, one byte
		// every 2 s. Refused before a byte of it is read.
		{"no token, big body announced", 100000, nil, "HTTP/1.1 413 Request Entity Too Large"},
		// A wrong token in the header is refused before the body is read.
		{"wrong token in the header", 1000, []string{web.TokenHeader + ": wrong-token-0123456789"}, "HTTP/1.1 401 Unauthorized"},
		// Without a header the form is read for its token field: cut when it
		// does not arrive in time.
		{"no token, slow small body", 1000, nil, "HTTP/1.1 408 Request Timeout"},
		// The right token does not buy a slow body time either.
		{"right token, slow body", 1000, []string{web.TokenHeader + ": " + testToken}, "HTTP/1.1 408 Request Timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := startTrickle(t, addr, "/actions/pause", tc.contentLength, 2*time.Second, tc.header...)
			require.Equal(t, tc.status, tr.wait(t))
		})
	}
	t.Cleanup(func() { require.Equal(t, []string{"", "", "", ""}, s.pausedKeys(), "nothing was paused") })
}

// 200 slow clients held open at once do not stop the listener answering
// /healthz (each connection has its own goroutine), and each of them is cut
// within 10 s.
func TestSlowClientsDoNotStopHealthz(t *testing.T) {
	s := newStack(t, testToken)
	addr := strings.TrimPrefix(s.url, "http://")
	const clients = 200
	var trickles []*trickle
	for range clients {
		trickles = append(trickles, startTrickle(t, addr, "/actions/pause", 1000, time.Second))
	}

	// Ask /healthz while they are all open: every answer is 200 and quick.
	c := &http.Client{Timeout: 5 * time.Second}
	var slowest time.Duration
	for range 20 {
		began := time.Now()
		resp, err := c.Get(s.url + "/healthz")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		slowest = max(slowest, time.Since(began))
	}
	measured := time.Now()
	t.Logf("the slowest of 20 /healthz answers took %s with %d slow clients connected", slowest, clients)
	require.Less(t, slowest, 2*time.Second, "/healthz answered slowly while %d slow clients were connected", clients)

	// Each must be closed within 10 s of its own request (wait's deadline
	// is absolute, so waiting for them in turn checks each).
	for i, tr := range trickles {
		require.Equal(t, "HTTP/1.1 408 Request Timeout", tr.wait(t), "client %d", i)
		require.True(t, tr.closed.After(measured), "client %d was cut before /healthz was measured: the test measured nothing", i)
	}
}

// An action's form may come URL-encoded (the dashboard) or as multipart
// (curl -F), the token in it; any other body is refused with the reason,
// as is a form over the size limit. Nothing changes on a refusal.
func TestActionForms(t *testing.T) {
	t.Parallel()
	s := newStack(t, testToken)
	// post sends body; chunked (no Content-Length) unless it is a []byte.
	post := func(action, contentType string, body any, token string) (int, string) {
		t.Helper()
		var r io.Reader
		switch b := body.(type) {
		case []byte:
			r = bytes.NewReader(b)
		case string:
			r = struct{ io.Reader }{strings.NewReader(b)} // hides the length
		}
		req, err := http.NewRequest(http.MethodPost, s.url+"/actions/"+action, r)
		require.NoError(t, err)
		req.Header.Set("Content-Type", contentType)
		if token != "" {
			req.Header.Set(web.TokenHeader, token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	multipartForm := func(fields ...string) (string, []byte) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for i := 0; i < len(fields); i += 2 {
			require.NoError(t, mw.WriteField(fields[i], fields[i+1]))
		}
		require.NoError(t, mw.Close())
		return mw.FormDataContentType(), buf.Bytes()
	}

	t.Run("refused", func(t *testing.T) {
		ct, body := multipartForm("token", "wrong-token-0123456789", "pool", "batch")
		code, msg := post("pause", ct, body, "")
		require.Equal(t, http.StatusUnauthorized, code)
		require.Equal(t, "refused: missing or wrong token", msg)

		code, msg = post("pause", "application/json", []byte(`{"token":"`+testToken+`","pool":"batch"}`), "")
		require.Equal(t, http.StatusUnsupportedMediaType, code)
		require.Equal(t, "refused: Content-Type application/json: send the form as application/x-www-form-urlencoded or multipart/form-data", msg)

		// Too long: said by its Content-Length, or found while reading.
		big := url.Values{"pool": {"batch"}, "token": {testToken}, "pad": {strings.Repeat("x", web.MaxActionBody)}}
		code, msg = post("pause", "application/x-www-form-urlencoded", []byte(big.Encode()), "")
		require.Equal(t, http.StatusRequestEntityTooLarge, code)
		require.Equal(t, fmt.Sprintf("refused: an action's form is at most %d bytes, this one says %d", web.MaxActionBody, len(big.Encode())), msg)
		code, msg = post("pause", "application/x-www-form-urlencoded", big.Encode(), "")
		require.Equal(t, http.StatusRequestEntityTooLarge, code)
		require.Equal(t, fmt.Sprintf("refused: an action's form is at most %d bytes", web.MaxActionBody), msg)
		ct, body = multipartForm("pool", "batch", "token", testToken, "pad", strings.Repeat("x", web.MaxActionBody))
		code, msg = post("pause", ct, string(body), "")
		require.Equal(t, http.StatusRequestEntityTooLarge, code, msg)
		require.Equal(t, fmt.Sprintf("refused: an action's form is at most %d bytes", web.MaxActionBody), msg)
		require.Equal(t, []string{"", "", "", ""}, s.pausedKeys(), "nothing changed")
	})

	t.Run("multipart with the token", func(t *testing.T) {
		ct, body := multipartForm("token", testToken, "pool", "batch")
		code, msg := post("pause", ct, body, "")
		require.Equal(t, http.StatusOK, code, msg)
		require.Equal(t, `pool "batch" paused`, msg)
		require.True(t, s.operatorPaused())

		ct, body = multipartForm("pool", "batch")
		code, msg = post("resume", ct, body, testToken)
		require.Equal(t, http.StatusOK, code, msg)
		require.Equal(t, `pool "batch" resumed`, msg)
		require.Equal(t, []string{"", "", "", ""}, s.pausedKeys())
	})
}
