package dataplane

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Browser peers.
//
// A volunteer's browser tab is not a federation member: it has no
// federation key to sign a DTLS fingerprint with and no client
// certificate for the mutual-TLS listener. It signals to the aggregator
// node that serves its page, over that page's HTTPS origin, with the
// volunteer's session token (Authorization: Bearer …): it posts its SDP
// offer and the node answers in the same response. The node is both the
// broker and the peer, so no third party relays the SDPs: TLS to the
// node carries both fingerprints, the browser holds the DTLS handshake to
// the node's and pion to the browser's. Over the data channels that
// follow, a tab moves blobs with the same framing and the same hash
// checks as a native member (transfer.go), under BrowserAuth.May rather
// than the federation's rules, and reaches no service (Peer.Call). When
// no channel comes up in time, the tab uses the HTTPS blob endpoint the
// same handler serves, under the same token and the same rule.
//
// The JavaScript side is browser.js, served at BrowserPrefix+"dataplane.js".

//go:embed browser.js
var browserJS []byte

// BrowserPrefix is where BrowserHandler serves signalling and the module.
const BrowserPrefix = "/p2p/browser/"

// BrowserAuth says who a browser is and what it may move.
type BrowserAuth struct {
	// Check authenticates a request (the volunteer session token in
	// Authorization: Bearer …, see BearerToken) and names the volunteer;
	// an error refuses it with 401.
	Check func(r *http.Request) (volunteer string, err error)
	// May decides whether volunteer may "get" or "put" ref, over a data
	// channel or over HTTPS alike.
	May func(volunteer, op string, ref content.Ref) error
}

// BearerToken returns the token of an "Authorization: Bearer <token>"
// header.
func BearerToken(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// Bounds on browser connections: each holds a PeerConnection (sockets,
// an SCTP association) on the node until the tab closes it or ICE finds
// the tab gone (consent freshness, some seconds).
const (
	MaxBrowserConns             = 64
	MaxBrowserConnsPerVolunteer = 2
)

// browserName is how a volunteer appears in the peer's counters, status
// and logs: never a federation member's name (members have no '/').
func browserName(volunteer string) string { return "browser/" + volunteer }

// BrowserHandler serves a browser's end of the data plane:
//
//	GET  /p2p/browser/dataplane.js  the module (browser.js), no token
//	GET  /p2p/browser/ice           STUN/TURN servers for the tab (token)
//	POST /p2p/browser/offer         {"sdp": offer} → {"sdp": answer} (token)
//	GET  /blobs/{ref}, PUT /blobs/{ref}  the HTTPS fallback (token, auth.May)
//
// It is meant for the listener a volunteer's page comes from (not the
// mutual-TLS API listener, which a browser cannot use). blobs is the
// node's store; ice may be nil (no STUN/TURN: host candidates only).
func (p *Peer) BrowserHandler(auth BrowserAuth, blobs *blob.Store, ice func(member string) []ICEServer) http.Handler {
	mux := http.NewServeMux()
	check := func(w http.ResponseWriter, r *http.Request) (string, bool) {
		if auth.Check == nil {
			refuse(w, http.StatusUnauthorized, diag.New(diag.P2PSignalRefused, "p2p", "this node takes no browser peers"))
			return "", false
		}
		v, err := auth.Check(r)
		if err != nil || v == "" {
			refuse(w, http.StatusUnauthorized, diag.New(diag.P2PSignalRefused, "p2p", "not a volunteer session: %v", err).
				WithHelp("send the volunteer session token as Authorization: Bearer <token>"))
			return "", false
		}
		return v, true
	}
	mux.HandleFunc("GET "+BrowserPrefix+"dataplane.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(browserJS)
	})
	mux.HandleFunc("GET "+BrowserPrefix+"ice", func(w http.ResponseWriter, r *http.Request) {
		v, ok := check(w, r)
		if !ok {
			return
		}
		var out []ICEServer
		if ice != nil {
			out = ice(browserName(v))
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(cmpNil(out))
	})
	mux.HandleFunc("POST "+BrowserPrefix+"offer", func(w http.ResponseWriter, r *http.Request) {
		v, ok := check(w, r)
		if !ok {
			return
		}
		var in struct {
			SDP string `json:"sdp"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxSignalBytes))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil || in.SDP == "" {
			refuse(w, http.StatusBadRequest, diag.New(diag.P2PSignalRefused, browserName(v), "unreadable offer: %v", err).
				WithHelp(`an offer is {"sdp": "<the RTCPeerConnection's local description, ICE gathering complete>"}`))
			return
		}
		sdp, err := p.answerBrowser(r.Context(), v, in.SDP, auth.May)
		if err != nil {
			status := http.StatusBadRequest
			if errors.Is(err, errBrowserBusy) {
				status = http.StatusTooManyRequests
			}
			refuse(w, status, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(map[string]string{"sdp": sdp})
	})
	mux.Handle("/blobs/", blob.Handler(blobs, func(w http.ResponseWriter, r *http.Request) bool {
		v, ok := check(w, r)
		if !ok {
			return false
		}
		ref, err := content.ParseRef(r.PathValue("ref"))
		if err != nil {
			return true // the blob handler refuses it
		}
		op := "get"
		if r.Method == http.MethodPut {
			op = "put"
		}
		if err := browserMay(auth.May, v, op, ref); err != nil {
			refuse(w, http.StatusForbidden, diag.New(diag.PoolForbidden, ref.Short(), "%v", err))
			return false
		}
		return true
	}))
	return mux
}

// browserMay applies may, refusing everything when there is none.
func browserMay(may func(string, string, content.Ref) error, volunteer, op string, ref content.Ref) error {
	if may == nil {
		return fmt.Errorf("this node lets browsers move no blobs")
	}
	return may(volunteer, op, ref)
}

var errBrowserBusy = errors.New("dataplane: too many browser connections")

// busy is a refusal for too many connections: the diagnostic, and
// errBrowserBusy for the handler's status.
type busy struct{ *diag.Diagnostic }

func (b busy) Unwrap() []error { return []error{b.Diagnostic, errBrowserBusy} }

// takeBrowser counts one more connection of volunteer, within the bounds.
func (p *Peer) takeBrowser(volunteer string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.browsers == nil {
		p.browsers = map[string]int{}
	}
	total := 0
	for _, n := range p.browsers {
		total += n
	}
	if p.closed {
		return fmt.Errorf("%w: the peer is closed", errBrowserBusy)
	}
	if total >= MaxBrowserConns || p.browsers[volunteer] >= MaxBrowserConnsPerVolunteer {
		return busy{diag.New(diag.P2PMailboxFull, browserName(volunteer), "too many browser connections: %d open on this node, %d of them this volunteer's", total, p.browsers[volunteer]).
			WithHelp("close the tab's other connections (one per tab is enough); the tab's blobs can go over HTTPS meanwhile")}
	}
	p.browsers[volunteer]++
	return nil
}

func (p *Peer) doneBrowser(volunteer string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.browsers[volunteer]--; p.browsers[volunteer] <= 0 {
		delete(p.browsers, volunteer)
	}
}

// answerBrowser answers a tab's offer: the answer SDP is returned at
// once (with every candidate gathered), and the connection completes, or
// is dropped, in the background. The tab's data channels are served
// under may.
func (p *Peer) answerBrowser(ctx context.Context, volunteer, offer string, may func(string, string, content.Ref) error) (string, error) {
	name := browserName(volunteer)
	if len(sdpFingerprints(offer)) == 0 {
		return "", diag.New(diag.P2PSignalRefused, name, "the offer carries no DTLS fingerprint")
	}
	if err := p.takeBrowser(volunteer); err != nil {
		return "", err
	}
	c := newConn(name)
	remote := client{Member: identity.Member{Name: name}, may: func(op string, ref content.Ref) error {
		return browserMay(may, volunteer, op, ref)
	}}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.ConnectTimeout)
	// The tab's channels are served for the connection's life, not the
	// offer request's.
	answer, err := p.answerOffer(ctx, context.Background(), c, remote, offer, true)
	if err != nil {
		cancel()
		c.close()
		p.doneBrowser(volunteer)
		return "", err
	}
	go func() {
		defer p.doneBrowser(volunteer)
		err := c.waitConnected(ctx)
		cancel()
		if err != nil {
			c.close()
			p.counter(name).failedDial()
			p.logf("p2p: browser %s: %v", name, err)
			return
		}
		c.describe()
		p.counter(name).connected(c.path, c.pair)
		p.track(c)
		p.logf("p2p: %s connected to us, path %s (%s)", name, c.path, c.pair)
		<-c.gone
		c.close()
	}()
	return answer, nil
}
