package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lci-labs/compartment/internal/app"
	"github.com/lci-labs/compartment/internal/testwait"
)

// testCAPEM is a well-formed certificate, for config checks that only read
// the file.
var testCAPEM = func() string {
	ca, _ := newTestCA()
	return string(ca.certPEM)
}()

type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

// newTestCA makes a private certificate authority.
func newTestCA() (*testCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "compartment test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// serverCert issues a certificate for dnsName only (no IP address), and
// returns it and its key in PEM.
func (ca *testCA) serverCert(t *testing.T, dnsName string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestRedisTLSPrivateCA: a Redis serving TLS with a certificate a private
// CA issued for a name other than the address the worker dials. With
// tls_ca_file and tls_server_name the worker connects; without either it
// is refused, and the refusal names the reason, not a secret.
func TestRedisTLSPrivateCA(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (.ci/run installs it)")
	}
	ca, err := newTestCA()
	require.NoError(t, err)
	dir := t.TempDir()
	certPEM, keyPEM := ca.serverCert(t, "redis.internal")
	for name, body := range map[string][]byte{"server.pem": certPEM, "server.key": keyPEM, "ca.pem": ca.certPEM} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), body, 0o600))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--tls-cert-file", filepath.Join(dir, "server.pem"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", dir)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testwait.For(t, 10*time.Second, "redis-server listening with TLS", func() bool {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})

	connect := func(extra string) error {
		body := withRedis(fmt.Sprintf("url: rediss://127.0.0.1:%d/2%s", port, extra))
		path := writeConfig(t, body)
		require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(path), "ca.pem"), ca.certPEM, 0o600))
		cfg, err := app.Load(path, nil)
		require.NoError(t, err)
		c, err := cfg.Redis.NewClient()
		require.NoError(t, err)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	require.NoError(t, connect("\n  tls_ca_file: ca.pem\n  tls_server_name: redis.internal"))
	require.ErrorContains(t, connect("\n  tls_server_name: redis.internal"), "certificate signed by unknown authority",
		"the system roots do not know the private CA")
	require.ErrorContains(t, connect("\n  tls_ca_file: ca.pem"), "cannot validate certificate for 127.0.0.1",
		"without the server name the certificate is checked against the address dialled")
}
