// Package studio is the live web view an aggregator node serves on its own
// listen address: jobs with their sweep heatmaps filling cell by cell,
// training runs with their loss curves, each silo's live (ε, δ), receipts
// and cluster health. Everything is drawn from the node's replica of the
// replicated state, pushed to browsers as server-sent events, so every
// node serves the same picture and every viewer of it sees the same
// session. The assets (plain HTML, CSS and JavaScript) are embedded; the
// page fetches nothing from any other host.
//
// Invariant: a viewer is a federation member, proved by a signed viewer
// token or a member's client certificate, and sees only what its role may:
// no undecided result (law 13), no open-pool values it could not read from
// the blob endpoint, and no other silo's full ledger records.
package studio

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

//go:embed assets
var assets embed.FS

// Server serves the Studio of one node.
type Server struct {
	src Source
	fed *identity.Federation
	log *slog.Logger
	now func() time.Time

	// build is serialised: the cache is not safe for concurrent use.
	buildMu sync.Mutex
	cache   *cache

	mu      sync.Mutex
	pic     *full
	last    []byte // pic without its version, to tell a change
	version uint64
	changed chan struct{} // closed and replaced when pic changes
	dirty   atomic.Bool
	viewers atomic.Int32
	kick    chan struct{}
	// secret, for a solo run, is the one viewer token (no federation).
	secret []byte

	streamsMu sync.Mutex
	streams   map[string]int // member → its open event streams
}

// MaxStreams bounds the event streams one member holds open at once (a
// tab holds one; a few tabs and reconnects fit). Each stream costs a
// goroutine and an encoding of every picture, so a member past the bound
// is refused (SC7404, 429) rather than let it grow the node's work.
const MaxStreams = 8

// NewServer returns a Studio over src, admitting the members of fed.
func NewServer(src Source, fed *identity.Federation, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{src: src, fed: fed, log: log, now: time.Now, cache: newCache(fed, log), changed: make(chan struct{}), kick: make(chan struct{}, 1)}
	s.dirty.Store(true)
	return s
}

// Coalesce is the shortest time between two pictures: events that land
// within it are drawn together. It bounds the redraw rate under a burst
// of events (a sweep's lease, commit, report and verify of every shard)
// and adds at most this much to a cell's delay.
const Coalesce = 50 * time.Millisecond

// Refresh redraws at least this often while someone watches, for what
// changes without an event (leader contact, commit index).
const Refresh = 2 * time.Second

// Run keeps the picture current until ctx ends: every applied event marks
// it stale, and while viewers are connected a stale picture is rebuilt
// (at most once per Coalesce) and pushed to all of them at once.
func (s *Server) Run(ctx context.Context) {
	events, cancel := s.src.Subscribe()
	defer func() { cancel() }()
	tick := time.NewTicker(Refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			s.dirty.Store(true)
			if !ok {
				// Dropped for falling behind: subscribe again; the
				// rebuild reads the state, so nothing is lost.
				events, cancel = s.src.Subscribe()
			}
		case <-tick.C:
			s.dirty.Store(true)
		case <-s.kick:
		}
		if s.viewers.Load() == 0 || !s.dirty.Load() {
			continue
		}
		s.rebuild(ctx)
		select { // coalesce a burst of events into the next picture
		case <-ctx.Done():
			return
		case <-time.After(Coalesce):
		}
	}
}

// rebuild builds a fresh picture and, when it differs from the last one,
// gives it the next version and wakes every stream.
func (s *Server) rebuild(ctx context.Context) *full {
	s.buildMu.Lock()
	defer s.buildMu.Unlock()
	s.dirty.Store(false)
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	f := s.cache.build(bctx, s.src)
	cancel()
	sum, err := json.Marshal(struct {
		P Picture
		L []LedgerEntry
	}{f.Picture, f.ledger})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.pic != nil && string(sum) == string(s.last) {
		return s.pic // nothing changed: no new version, nobody woken
	}
	s.last = sum
	s.version++
	f.Version = s.version
	s.pic = f
	close(s.changed)
	s.changed = make(chan struct{})
	return f
}

// current returns the latest picture and the channel closed when it is
// replaced, building one if there is none yet, or (fresh) if it is stale.
// Streams leave rebuilding to Run, which coalesces bursts of events.
func (s *Server) current(ctx context.Context, fresh bool) (*full, <-chan struct{}) {
	s.mu.Lock()
	f, ch := s.pic, s.changed
	s.mu.Unlock()
	if f == nil || (fresh && s.dirty.Load()) {
		f = s.rebuild(ctx)
		s.mu.Lock()
		ch = s.changed
		s.mu.Unlock()
	}
	return f, ch
}

// Handler serves the page, its assets and the viewer API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	// The assets hold no data: they are served to anyone, so the page can
	// explain how to sign in.
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", files))
	mux.HandleFunc("GET /{$}", s.page)
	mux.HandleFunc("GET /api/picture", s.viewer(s.picture))
	mux.HandleFunc("GET /api/events", s.viewer(s.events))
	mux.HandleFunc("GET /api/ledger/{silo}", s.viewer(s.ledger))
	return securityHeaders(mux)
}

// securityHeaders keeps the page to its own origin: no script, style,
// image or connection elsewhere, and no framing.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

// cookieName holds the viewer token in the browser.
const cookieName = "scellis_viewer"

// page serves index.html. A ?token= in the URL (what `scellis studio
// token` prints) is checked, stored in an HttpOnly cookie and taken out of
// the address bar by a redirect.
func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	if tok := r.URL.Query().Get("token"); tok != "" {
		expiry := time.Time{} // a solo run's cookie lives as long as the browser session
		if s.secret != nil {
			if _, err := s.soloViewer(tok); err != nil {
				s.refuse(w, r, err)
				return
			}
		} else {
			_, c, err := VerifyToken(tok, s.fed, s.now())
			if err != nil {
				s.refuse(w, r, err)
				return
			}
			expiry = time.Unix(c.Expiry, 0)
		}
		http.SetCookie(w, &http.Cookie{Name: cookieName, Value: tok, Path: "/", HttpOnly: true, Secure: true,
			SameSite: http.SameSiteStrictMode, Expires: expiry})
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	if _, _, err := s.authenticate(r); err != nil {
		s.refuse(w, r, err)
		return
	}
	b, err := assets.ReadFile("assets/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b)
}

type viewerKey struct{}

type viewerCtx struct {
	v Viewer
	m identity.Member
}

// viewer admits authenticated viewers only.
func (s *Server) viewer(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, m, err := s.authenticate(r)
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), viewerKey{}, viewerCtx{v, m})))
	}
}

func viewerOf(r *http.Request) viewerCtx {
	v, _ := r.Context().Value(viewerKey{}).(viewerCtx)
	return v
}

var errNoViewer = errors.New("studio: no viewer token or member certificate")

// authenticate finds the viewer: a member's client certificate, else a
// viewer token from the Authorization header or the cookie.
func (s *Server) authenticate(r *http.Request) (Viewer, identity.Member, error) {
	if s.secret == nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		if m, ok := s.fed.PeerFromRequest(r); ok {
			return Viewer{Member: m.Name, Role: string(m.Role), Via: "certificate"}, m, nil
		}
	}
	tok := ""
	if h := r.Header.Get("Authorization"); len(h) > 7 && h[:7] == "Bearer " {
		tok = h[7:]
	} else if c, err := r.Cookie(cookieName); err == nil {
		tok = c.Value
	}
	if s.secret != nil {
		v, err := s.soloViewer(tok)
		// The owner of a solo run sees all of it, like an operator.
		return v, identity.Member{Name: v.Member, Role: identity.Operator}, err
	}
	if tok == "" {
		return Viewer{}, identity.Member{}, errNoViewer
	}
	m, _, err := VerifyToken(tok, s.fed, s.now())
	if err != nil {
		return Viewer{}, identity.Member{}, err
	}
	return Viewer{Member: m.Name, Role: string(m.Role), Via: "token"}, m, nil
}

// refuse answers an unauthenticated request: 401 with the diagnostic,
// as JSON for the API and as a short page for a browser.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	d := diag.New(diag.StudioTokenRefused, "viewer", "%v", err).
		WithHelp("issue a fresh token with 'scellis studio token --member NAME --ttl 8h' and open the URL it prints")
	if errors.Is(err, errNoViewer) {
		d = diag.New(diag.StudioNoViewer, "viewer", "this Studio shows federation state to members only, and the request carries no viewer token or member certificate").
			WithHelp("run 'scellis studio token --member NAME --ttl 8h' with the member's identity and open the URL it prints")
	}
	s.log.Info("studio viewer refused", "remote", r.RemoteAddr, "err", err)
	writeDiag(w, r, http.StatusUnauthorized, d)
}

func writeDiag(w http.ResponseWriter, r *http.Request, status int, d *diag.Diagnostic) {
	if r.URL.Path == "/" {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		fmt.Fprintf(w, "<!doctype html><meta charset=utf-8><title>Scellis Studio</title><link rel=stylesheet href=/assets/app.css><main class=refused><h1>Scellis Studio</h1><p><b>%s</b> %s</p><p>%s</p></main>\n",
			d.Code, htmlEscape(d.Message), htmlEscape(d.Help))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	diag.RenderJSON(w, diag.List{d})
}

func htmlEscape(s string) string {
	b, _ := json.Marshal(s) // escapes <, >, & as \u003c…
	return string(b[1 : len(b)-1])
}

// picture answers the viewer's picture as JSON.
func (s *Server) picture(w http.ResponseWriter, r *http.Request) {
	vc := viewerOf(r)
	f, _ := s.current(r.Context(), true)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(f.forViewer(vc.v, vc.m))
}

// ledger answers a silo's full ledger records, to that silo only.
func (s *Server) ledger(w http.ResponseWriter, r *http.Request) {
	vc := viewerOf(r)
	name := r.PathValue("silo")
	if name != vc.m.Name {
		writeDiag(w, r, http.StatusForbidden, diag.New(diag.StudioForbidden, name, "%s may not see %s's full ledger records", vc.m.Name, name).
			WithHelp("every viewer sees each silo's published (ε, δ) in the privacy view; the full records are for the silo's own token"))
		return
	}
	f, _ := s.current(r.Context(), true)
	out := f.ledgerOf(name)
	if out == nil {
		out = []LedgerEntry{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(out)
}

// KeepAlive is how often an idle event stream sends a comment, so proxies
// and browsers keep it open.
const KeepAlive = 15 * time.Second

// events streams the viewer's picture: once at once, then every time it
// changes. All streams wake on the same picture, so every viewer sees the
// same session.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	vc := viewerOf(r)
	if !s.enterStream(vc.v.Member) {
		writeDiag(w, r, http.StatusTooManyRequests, diag.New(diag.StudioBusy, vc.v.Member, "%s already holds %d Studio event streams", vc.v.Member, MaxStreams).
			WithHelp("close other Studio tabs of this member; every tab needs one stream"))
		return
	}
	defer s.leaveStream(vc.v.Member)
	s.viewers.Add(1)
	defer s.viewers.Add(-1)
	select { // wake Run: there is someone to draw for now
	case s.kick <- struct{}{}:
	default:
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	keep := time.NewTicker(KeepAlive)
	defer keep.Stop()
	var sent uint64
	for {
		f, changed := s.current(r.Context(), false)
		if f.Version != sent {
			b, err := json.Marshal(f.forViewer(vc.v, vc.m))
			if err != nil {
				return
			}
			fmt.Fprintf(w, "event: picture\nid: %s\ndata: %s\n\n", strconv.FormatUint(f.Version, 10), b)
			flusher.Flush()
			sent = f.Version
		}
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			fmt.Fprint(w, ": keep-alive\n\n")
			flusher.Flush()
		case <-changed:
		}
	}
}

func (s *Server) enterStream(member string) bool {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.streams == nil {
		s.streams = map[string]int{}
	}
	if s.streams[member] >= MaxStreams {
		return false
	}
	s.streams[member]++
	return true
}

func (s *Server) leaveStream(member string) {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	if s.streams[member]--; s.streams[member] <= 0 {
		delete(s.streams, member)
	}
}

// TLSConfig is the Studio's TLS. Browsers do not take Ed25519
// certificates, so besides the node's own certificate (derived from its
// identity key, like the API's, for members' clients that pin it) the
// Studio holds an ECDSA P-256 certificate made at start for this process,
// and gives it to every client that cannot take Ed25519; sha is its
// SHA-256, for the operator to compare with what the browser shows. A client certificate is requested but not required, so a member's
// certificate admits it while a browser without one signs in with a viewer
// token.
func TLSConfig(id *identity.Identity, fed *identity.Federation, host string) (cfg *tls.Config, sha string, err error) {
	cfg, err = identity.ServerTLSConfig(id, fed)
	if err != nil {
		return nil, "", err
	}
	self, _ := fed.Lookup(id.Public())
	browser, err := browserCert(self.Name, host)
	if err != nil {
		return nil, "", err
	}
	pinned := cfg.GetCertificate
	cfg.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		// The pinned certificate names the member, not a host, so ask
		// only whether the client can verify Ed25519 at all.
		if slices.Contains(hello.SignatureSchemes, tls.Ed25519) {
			return pinned(hello)
		}
		return browser, nil
	}
	verify := cfg.VerifyConnection
	cfg.ClientAuth = tls.RequestClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return nil // a browser: the viewer token decides
		}
		return verify(cs)
	}
	return cfg, fingerprint(browser), nil
}

// BrowserTLSConfig is a TLS 1.3 configuration for a page served to
// browsers only (the volunteer page): the ECDSA certificate the Studio
// gives browsers, since they do not accept Ed25519 ones, and no client
// certificates. It returns the certificate's SHA-256 fingerprint too.
func BrowserTLSConfig(name, host string) (*tls.Config, string, error) {
	c, err := browserCert(name, host)
	if err != nil {
		return nil, "", err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*c}}, fingerprint(c), nil
}

func fingerprint(c *tls.Certificate) string {
	sum := sha256.Sum256(c.Certificate[0])
	return fmt.Sprintf("%X", sum[:])
}

// browserCert makes a self-signed ECDSA P-256 certificate for the
// Studio's host (and localhost), valid for a year.
func browserCert(name, host string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name + " studio", Organization: []string{"Scellis"}},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	} else if host != "" {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Listen serves the Studio on addr over TLS until ctx ends.
func (s *Server) Listen(ctx context.Context, addr string, cfg *tls.Config) (net.Addr, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, diag.New(diag.WorkerConfig, "studio", "the Studio cannot listen on %s: %v", addr, err).
			WithHelp("another process holds the port, or the address is not this machine's")
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		if err := srv.Serve(tls.NewListener(ln, cfg)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("studio server", "err", err)
		}
	}()
	stop := func() {
		cancel()
		sctx, c := context.WithTimeout(context.Background(), time.Second)
		srv.Shutdown(sctx)
		c()
		srv.Close()
		wg.Wait()
	}
	return ln.Addr(), stop, nil
}

func trimFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
