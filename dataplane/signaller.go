package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/identity"
)

// Home is the aggregator a member moves blobs with by default: an
// aggregator itself; every other member the first aggregator in the
// federation file (the others are its failover, Blobs.Others). ok is false
// when there is no aggregator.
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

// Signalling is the Signaller of one member. An aggregator's mail is in
// its own mailbox (Local). Every other member's mail may be in any
// aggregator's: a signal for it is posted to the first aggregator that
// takes it, and it long-polls every aggregator at once — so two members
// meet as long as one aggregator answers both, whichever nodes are down.
type Signalling struct {
	self  string
	fed   *identity.Federation
	http  *http.Client
	Local *Mailbox // this aggregator's own mailbox; nil on other members
	// Wait is the long poll of Receive (default 20 s).
	Wait time.Duration

	pref  atomic.Int32 // the aggregator that last took a post: tried first
	start sync.Once
	inbox chan []Signal // mail gathered by the pollers of every aggregator
}

var _ Signaller = (*Signalling)(nil)

// attempt bounds one post or ICE fetch at one aggregator, so a silent node
// costs a few seconds before the next is tried.
const attempt = 3 * time.Second

// NewSignalling returns the signaller of member self (id's owner).
func NewSignalling(id *identity.Identity, fed *identity.Federation, self string, local *Mailbox) (*Signalling, error) {
	tlsCfg, err := identity.ClientTLSConfig(id, fed, "", identity.Aggregator)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true, TLSHandshakeTimeout: 5 * time.Second, MaxIdleConnsPerHost: 4}
	return &Signalling{self: self, fed: fed, http: &http.Client{Transport: tr}, Local: local, inbox: make(chan []Signal, 16)}, nil
}

// order returns the aggregators to try, the preferred one first.
func (s *Signalling) order() []identity.Member {
	aggs := s.fed.ByRole(identity.Aggregator)
	if len(aggs) == 0 {
		return nil
	}
	k := int(s.pref.Load()) % len(aggs)
	return append(aggs[k:len(aggs):len(aggs)], aggs[:k]...)
}

func (s *Signalling) prefer(name string) {
	for i, a := range s.fed.ByRole(identity.Aggregator) {
		if a.Name == name {
			s.pref.Store(int32(i))
		}
	}
}

// Send implements Signaller.
func (s *Signalling) Send(ctx context.Context, sig Signal) error {
	to, ok := s.fed.Member(sig.To)
	if !ok {
		return fmt.Errorf("dataplane: %q is not a member of the federation", sig.To)
	}
	if to.Role == identity.Aggregator {
		if s.Local != nil && to.Name == s.self {
			return s.Local.Post(s.self, sig)
		}
		return s.post(ctx, to, sig)
	}
	if s.Local != nil {
		return s.Local.Post(s.self, sig) // the recipient polls this node too
	}
	var errs []error
	for _, a := range s.order() {
		err := s.post(ctx, a, sig)
		if err == nil {
			s.prefer(a.Name)
			return nil
		}
		var refused refusal
		if errors.As(err, &refused) || ctx.Err() != nil {
			return err // the mailbox answered no: another's would too
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return fmt.Errorf("dataplane: the federation has no aggregator to signal through")
	}
	return fmt.Errorf("no aggregator took the signal: %w", errors.Join(errs...))
}

// refusal is a mailbox's answer refusing a signal (full, or not the
// sender's to post).
type refusal struct{ error }

func (s *Signalling) post(ctx context.Context, to identity.Member, sig Signal) error {
	b, err := json.Marshal(sig)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, attempt)
	defer cancel()
	base := "https://" + to.Address
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
		err := fmt.Errorf("mailbox at %s: %s: %s", to.Name, resp.Status, bytes.TrimSpace(msg))
		if resp.StatusCode < 500 {
			return refusal{err}
		}
		return err
	}
	return nil
}

// Receive implements Signaller. On a member that is not an aggregator, the
// first call starts one long-polling loop per aggregator, which run until
// that call's ctx ends (Peer.Run's).
func (s *Signalling) Receive(ctx context.Context) ([]Signal, error) {
	wait := cmpOr(s.Wait, 20*time.Second)
	if s.Local != nil {
		return s.Local.Take(ctx, s.self, wait), nil
	}
	aggs := s.fed.ByRole(identity.Aggregator)
	if len(aggs) == 0 {
		return nil, fmt.Errorf("dataplane: the federation has no aggregator to signal through")
	}
	s.start.Do(func() {
		for _, a := range aggs {
			go s.poll(ctx, a, wait)
		}
	})
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var out []Signal
	select {
	case mail := <-s.inbox:
		out = append(out, mail...)
	case <-timer.C:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for {
		select {
		case mail := <-s.inbox:
			out = append(out, mail...)
		default:
			return out, nil
		}
	}
}

// poll long-polls a's mailbox for this member's mail until ctx ends; a
// node that does not answer is asked again after a pause.
func (s *Signalling) poll(ctx context.Context, a identity.Member, wait time.Duration) {
	url := fmt.Sprintf("https://%s/p2p/signal?wait_ms=%d", a.Address, wait.Milliseconds())
	pause := time.Second
	for ctx.Err() == nil {
		var mail []Signal
		pctx, cancel := context.WithTimeout(ctx, wait+attempt)
		err := s.get(pctx, url, &mail)
		cancel()
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			pause = min(2*pause, 5*time.Second)
			continue
		}
		pause = time.Second
		if len(mail) > 0 {
			select {
			case s.inbox <- mail:
			case <-ctx.Done():
			}
		}
	}
}

// ICE fetches the ICE servers (with short-lived TURN credentials) that the
// aggregators hand out: every aggregator is asked at once, and the first
// answer is used, so a silent node costs nothing.
func (s *Signalling) ICE(ctx context.Context) ([]ICEServer, error) {
	aggs := s.order()
	if len(aggs) == 0 {
		return nil, fmt.Errorf("dataplane: the federation has no aggregator")
	}
	ctx, cancel := context.WithTimeout(ctx, attempt)
	defer cancel() // the slower asks stop
	type got struct {
		servers []ICEServer
		err     error
	}
	results := make(chan got, len(aggs))
	for _, a := range aggs {
		go func() {
			var out []ICEServer
			err := s.get(ctx, "https://"+a.Address+"/p2p/ice", &out)
			results <- got{out, err}
		}()
	}
	var errs []error
	for range aggs {
		r := <-results
		if r.err == nil {
			return r.servers, nil
		}
		errs = append(errs, r.err)
	}
	return nil, errors.Join(errs...)
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
