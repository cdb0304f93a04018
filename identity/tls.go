package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"slices"
	"sync"
	"time"
)

// How TLS pinning works.
//
// Each side presents a self-signed X.509 certificate made at run time from
// its identity key (subject CN = its member name, O = the federation name).
// No certificate authority, chain, name or validity period is checked:
// TLS 1.3's CertificateVerify proves the peer holds the private key of the
// certificate's public key, and VerifyConnection accepts the connection only
// if that Ed25519 key is a member of the federation file — with an allowed
// role, and on the client side the member that was dialled. Anything else
// fails the handshake with a bad_certificate alert. TLS 1.2 and below,
// session tickets and resumption are off.

// certValidity is how long a generated certificate claims to be valid; it
// is renewed at half-life. Validity is informational (peers pin keys), but
// keeping it current spares tools that look at it.
const certValidity = 7 * 24 * time.Hour

// ServerTLSConfig returns a TLS 1.3 server config for id, which must be a
// member of fed (else SC1110). Every client must present a certificate
// whose Ed25519 key is a member of fed; when allow is not empty, the
// member's role must be one of allow. Use fed.Peer or fed.PeerFromRequest to
// learn who connected.
//
// The config can be used by http.Server, tls.NewListener or a Raft stream
// layer; callers may set NextProtos on it.
func ServerTLSConfig(id *Identity, fed *Federation, allow ...Role) (*tls.Config, error) {
	src, err := newCertSource(id, fed)
	if err != nil {
		return nil, err
	}
	allow = slices.Clone(allow)
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		ClientAuth:             tls.RequireAnyClientCert,
		SessionTicketsDisabled: true,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return src.get()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := fed.verifyPeer(cs, "", allow)
			return err
		},
	}, nil
}

// ClientTLSConfig returns a TLS 1.3 client config for id, which must be a
// member of fed (else SC1110). The server must present a certificate whose
// Ed25519 key is a member of fed; when expectName is not empty it must be
// that member (which must exist, else SC1110), and when allow is not empty
// the member's role must be one of allow. expectName "" with allow
// [Aggregator] accepts any aggregator, as a Raft transport or a client
// following the leader needs.
func ClientTLSConfig(id *Identity, fed *Federation, expectName string, allow ...Role) (*tls.Config, error) {
	src, err := newCertSource(id, fed)
	if err != nil {
		return nil, err
	}
	if expectName != "" {
		if _, ok := fed.Member(expectName); !ok {
			return nil, fed.errNotMember("no member is named %q", expectName)
		}
	}
	allow = slices.Clone(allow)
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: expectName,
		// No CA chain or host name to check: VerifyConnection pins the
		// server's key to the federation file instead.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return src.get()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := fed.verifyPeer(cs, expectName, allow)
			return err
		},
	}, nil
}

// Peer returns the member at the other end of a completed handshake, found
// by its certificate's key in f. Call it after the handshake (tls.Conn's
// Handshake, or any Read or Write); before it, ok is false.
func (f *Federation) Peer(cs *tls.ConnectionState) (Member, bool) {
	if cs == nil || !cs.HandshakeComplete {
		return Member{}, false
	}
	m, err := f.verifyPeer(*cs, "", nil)
	return m, err == nil
}

type peerKey struct{}

// WithPeer returns ctx marked as carrying a request from the member whose
// key is k, for PeerFromRequest. Only a server that authenticated k itself
// may use it: the data plane, for a request that came over a WebRTC data
// channel whose DTLS fingerprint k signed (package dataplane). Nothing a
// client sends can set a context value.
func WithPeer(ctx context.Context, k PublicKey) context.Context {
	return context.WithValue(ctx, peerKey{}, k)
}

// verifyPeer authenticates the peer of cs: its leaf certificate's Ed25519
// key must be a member, named expect when expect is set, with a role in
// allow when allow is set.
func (f *Federation) verifyPeer(cs tls.ConnectionState, expect string, allow []Role) (Member, error) {
	if len(cs.PeerCertificates) == 0 {
		return Member{}, ErrNoPeerKey
	}
	pub, ok := cs.PeerCertificates[0].PublicKey.(ed25519.PublicKey)
	if !ok {
		return Member{}, ErrNoPeerKey
	}
	k, ok := publicKeyOf(pub)
	if !ok {
		return Member{}, ErrNoPeerKey
	}
	m, ok := f.Lookup(k)
	if !ok {
		return Member{}, fmt.Errorf("%w %q: %s", ErrUnknownPeer, f.Name, k)
	}
	if expect != "" && m.Name != expect {
		return Member{}, fmt.Errorf("%w: dialled %q, reached %q", ErrUnexpectedPeer, expect, m.Name)
	}
	if len(allow) > 0 && !slices.Contains(allow, m.Role) {
		return Member{}, fmt.Errorf("%w: %q is a %s, allowed: %v", ErrPeerRole, m.Name, m.Role, allow)
	}
	return m, nil
}

// certSource hands out this node's certificate, making a new one when the
// current one reaches half its validity.
type certSource struct {
	id       *Identity
	name     string
	org      string
	mu       sync.Mutex
	cert     *tls.Certificate
	certKey  PublicKey // the key cert was made for: a rotated identity gets a new one
	renewAt  time.Time
	validity time.Duration
}

func newCertSource(id *Identity, fed *Federation) (*certSource, error) {
	self, ok := fed.Lookup(id.Public())
	if !ok {
		return nil, fed.errNotMember("this node's key %s is not in the federation", id.Public())
	}
	s := &certSource{id: id, name: self.Name, org: fed.Name, validity: certValidity}
	if _, err := s.get(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *certSource) get() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	kp := s.id.keys() // one pair: a concurrent rotation must not mix keys
	key := kp.pub
	if s.cert != nil && now.Before(s.renewAt) && s.certKey.Equal(key) {
		return s.cert, nil
	}
	c, err := selfSigned(kp, s.name, s.org, now, s.validity)
	if err != nil {
		return nil, err
	}
	s.cert, s.certKey, s.renewAt = c, key, now.Add(s.validity/2)
	return c, nil
}

// selfSigned makes a certificate for the key pair kp, subject CN=name, O=org.
func selfSigned(kp *keyPair, name, org string, now time.Time, validity time.Duration) (*tls.Certificate, error) {
	priv := kp.priv
	tmpl := &x509.Certificate{
		// SerialNumber nil: CreateCertificate draws a random one.
		Subject:               pkix.Name{CommonName: name, Organization: []string{org}},
		NotBefore:             now.Add(-time.Hour), // tolerate clock skew
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, priv.Public(), priv)
	if err != nil {
		return nil, fmt.Errorf("identity: making the certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("identity: parsing the certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv, Leaf: leaf}, nil
}
