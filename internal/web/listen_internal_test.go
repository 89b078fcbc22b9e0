package web

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// Where a bound address can be reached from, for addresses a test cannot
// bind on every machine.
func TestListeningOn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ip   string
		want Listening
	}{
		{"127.0.0.1", Listening{Addr: "127.0.0.1:8080", URL: "http://127.0.0.1:8080/", Loopback: true}},
		{"127.0.1.1", Listening{Addr: "127.0.1.1:8080", URL: "http://127.0.1.1:8080/", Loopback: true}},
		{"::1", Listening{Addr: "[::1]:8080", URL: "http://[::1]:8080/", Loopback: true}},
		{"0.0.0.0", Listening{Addr: "0.0.0.0:8080", URL: "http://127.0.0.1:8080/"}},
		{"::", Listening{Addr: "[::]:8080", URL: "http://127.0.0.1:8080/"}},
		{"10.1.2.3", Listening{Addr: "10.1.2.3:8080", URL: "http://10.1.2.3:8080/"}},
		{"fd00::5", Listening{Addr: "[fd00::5]:8080", URL: "http://[fd00::5]:8080/"}},
	} {
		t.Run(tc.ip, func(t *testing.T) {
			require.Equal(t, tc.want, listeningOn(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 8080}))
		})
	}
}
