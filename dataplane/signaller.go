package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/scellis/scellis/identity"
)

// Home is the aggregator whose mailbox holds member's mail: an
// aggregator reads its own; every other member reads the first
// aggregator's in the federation file, so two silos meet at one mailbox
// without any replicated state. ok is false when there is no aggregator.
func Home(fed *identity.Federation, member string) (identity.Member, bool) {
	if m, ok := fed.Member(member); ok && m.Role == identity.Aggregator {
		return m, true
	}
	aggs := fed.ByRole(identity.Aggregator)
	if len(aggs) == 0 {
		return identity.Member{}, false
	}
	return aggs[0], true
}

// Signalling is the Signaller of one member: it posts each signal to
// its recipient's home mailbox over mutual TLS, and reads its own mail
// from its home (or, on an aggregator, from Local directly).
type Signalling struct {
	self  string
	fed   *identity.Federation
	http  *http.Client
	Local *Mailbox // this aggregator's own mailbox; nil on other members
	// Wait is the long poll of Receive (default 20 s).
	Wait time.Duration
}

var _ Signaller = (*Signalling)(nil)

// NewSignalling returns the signaller of member self (id's owner).
func NewSignalling(id *identity.Identity, fed *identity.Federation, self string, local *Mailbox) (*Signalling, error) {
	tlsCfg, err := identity.ClientTLSConfig(id, fed, "", identity.Aggregator)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true, TLSHandshakeTimeout: 5 * time.Second, MaxIdleConnsPerHost: 4}
	return &Signalling{self: self, fed: fed, http: &http.Client{Transport: tr}, Local: local}, nil
}

func (s *Signalling) base(member string) (string, error) {
	h, ok := Home(s.fed, member)
	if !ok {
		return "", fmt.Errorf("dataplane: the federation has no aggregator to signal through")
	}
	return "https://" + h.Address, nil
}

// Send implements Signaller.
func (s *Signalling) Send(ctx context.Context, sig Signal) error {
	if h, ok := Home(s.fed, sig.To); ok && s.Local != nil && h.Name == s.self {
		return s.Local.Post(s.self, sig)
	}
	base, err := s.base(sig.To)
	if err != nil {
		return err
	}
	b, err := json.Marshal(sig)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/p2p/signal", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("mailbox at %s: %s: %s", base, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// Receive implements Signaller.
func (s *Signalling) Receive(ctx context.Context) ([]Signal, error) {
	wait := cmpOr(s.Wait, 20*time.Second)
	if s.Local != nil {
		return s.Local.Take(ctx, s.self, wait), nil
	}
	base, err := s.base(s.self)
	if err != nil {
		return nil, err
	}
	var out []Signal
	err = s.get(ctx, fmt.Sprintf("%s/p2p/signal?wait_ms=%d", base, wait.Milliseconds()), &out)
	return out, err
}

// ICE fetches the ICE servers (with short-lived TURN credentials) that
// the member's home aggregator hands out.
func (s *Signalling) ICE(ctx context.Context) ([]ICEServer, error) {
	base, err := s.base(s.self)
	if err != nil {
		return nil, err
	}
	var out []ICEServer
	return out, s.get(ctx, base+"/p2p/ice", &out)
}

func (s *Signalling) get(ctx context.Context, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(msg))
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
}
