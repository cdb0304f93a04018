package volunteer

import (
	"container/list"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/trust"
	"github.com/scellis/scellis/volunteer/proof"
)

// Joining. A tab asks for a challenge for its public key; the challenge
// carries its expiry, the difficulty and a random value, all under an
// HMAC-SHA256 of a key this node made at start, bound to the tab's key.
// The tab solves the proof of work (proof.Solve) and signs the join
// message with its key; the node checks the MAC in constant time, the
// expiry, the work, the signature, and that the challenge was not used
// before, then issues a session token: "vs1.<id>.<secret>", the secret
// compared in constant time. Sessions live in this node's memory: a
// restarted node, or another node, asks the tab to join again.

const challengePrefix = "vc1."

var b64 = base64.RawURLEncoding

// ChallengeRequest asks for a join challenge for Key (text form).
type ChallengeRequest struct {
	Key string `json:"key"`
}

// Challenge is the node's answer.
type Challenge struct {
	Challenge  string `json:"challenge"`
	Difficulty int    `json:"difficulty"`
	Expires    int64  `json:"expires"` // unix ms
}

// JoinRequest proves the work and the key.
type JoinRequest struct {
	Key       string `json:"key"`
	Challenge string `json:"challenge"`
	Nonce     string `json:"nonce"` // decimal
	Sig       string `json:"sig"`   // base64 (standard) of the join signature
}

// Session is what a join answers.
type Session struct {
	Token   string `json:"token"`
	Peer    string `json:"peer"`
	Expires int64  `json:"expires"` // unix ms
}

type session struct {
	secret []byte
	key    string
	peer   string
	origin string // the join's network prefix (Prefix), fixed for the session
	expiry time.Time
}

// The prefixes whose volunteers never answer one shard together
// (coordinator.Lease.Origin): an IPv4 /24 and an IPv6 /56, the smallest
// blocks a home or small office commonly gets, so two keys of one person
// at one place share one.
const (
	ReplicaPrefixV4 = 24
	ReplicaPrefixV6 = 56
)

// Prefix is the network of ip (text form) in CIDR notation, masked to
// bits4 for IPv4 (and IPv4-mapped IPv6) and bits6 for IPv6; an
// unparsable ip is returned as it is, so it is still one origin.
func Prefix(ip string, bits4, bits6 int) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	a = a.Unmap()
	bits := bits6
	if a.Is4() {
		bits = bits4
	}
	p, err := a.WithZone("").Prefix(bits)
	if err != nil {
		return ip
	}
	return p.String()
}

func (s *Server) challengeMAC(key string, payload []byte) []byte {
	m := hmac.New(sha256.New, s.mac)
	m.Write([]byte("scellis/volunteer-challenge/v1\x00"))
	m.Write([]byte(key))
	m.Write([]byte{0})
	m.Write(payload)
	return m.Sum(nil)
}

func (s *Server) open(w http.ResponseWriter, r *http.Request) bool {
	if s.be.Regime() != trust.Open {
		writeDiag(w, http.StatusForbidden, diag.New(diag.VolunteerClosed, "pool", "this pool is %s; browser volunteers take part in open pools only", s.be.Regime()).
			WithHelp("an open pool runs public inputs only; ask the pool's operator which pool takes volunteers"))
		return false
	}
	if why := s.lim.allow(clientIP(r), s.now()); why != "" {
		w.Header().Set("Retry-After", "10")
		writeDiag(w, http.StatusTooManyRequests, diag.New(diag.VolunteerRateLimited, clientIP(r), "%s", why).
			WithHelp("wait a minute and press Start again; the page retries by itself"))
		return false
	}
	return true
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (s *Server) challenge(w http.ResponseWriter, r *http.Request) {
	var req ChallengeRequest
	if !decode(w, r, &req) || !s.open(w, r) {
		return
	}
	if _, ok := receipt.ParseKey(req.Key); !ok {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.VolunteerBadRequest, "key", "%q is not an Ed25519 public key in text form", clip(req.Key)).
			WithHelp("the page makes its key with scellisVolunteerKey; reload it"))
		return
	}
	exp := s.now().Add(challengeTTL)
	payload := make([]byte, 8+1+16)
	binary.BigEndian.PutUint64(payload, uint64(exp.UnixMilli()))
	payload[8] = byte(s.opt.Difficulty)
	if _, err := rand.Read(payload[9:]); err != nil {
		writeDiag(w, http.StatusInternalServerError, diag.New(diag.VolunteerBadRequest, "challenge", "%v", err))
		return
	}
	c := challengePrefix + b64.EncodeToString(append(payload, s.challengeMAC(req.Key, payload)...))
	writeJSON(w, http.StatusOK, Challenge{Challenge: c, Difficulty: s.opt.Difficulty, Expires: exp.UnixMilli()})
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func (s *Server) join(w http.ResponseWriter, r *http.Request) {
	var req JoinRequest
	if !decode(w, r, &req) || !s.open(w, r) {
		return
	}
	pub, ok := receipt.ParseKey(req.Key)
	if !ok {
		writeDiag(w, http.StatusBadRequest, diag.New(diag.VolunteerBadRequest, "key", "%q is not an Ed25519 public key in text form", clip(req.Key)))
		return
	}
	bad := func(format string, args ...any) {
		writeDiag(w, http.StatusForbidden, diag.New(diag.VolunteerBadChallenge, "challenge", format, args...).
			WithHelp("ask for a new challenge (POST /volunteer/v1/challenge) and solve it within %s; each challenge joins once", challengeTTL))
	}
	raw, err := b64.DecodeString(strings.TrimPrefix(req.Challenge, challengePrefix))
	if !strings.HasPrefix(req.Challenge, challengePrefix) || err != nil || len(raw) != 8+1+16+32 {
		bad("the challenge is malformed")
		return
	}
	payload, mac := raw[:25], raw[25:]
	if !hmac.Equal(mac, s.challengeMAC(req.Key, payload)) {
		bad("the challenge was not issued by this node for this key")
		return
	}
	exp := time.UnixMilli(int64(binary.BigEndian.Uint64(payload)))
	if !s.now().Before(exp) {
		bad("the challenge expired at %s", exp.UTC().Format(time.RFC3339))
		return
	}
	nonce, err := strconv.ParseUint(req.Nonce, 10, 64)
	if err != nil || !proof.Check(req.Challenge, req.Key, nonce, int(payload[8])) {
		writeDiag(w, http.StatusForbidden, diag.New(diag.VolunteerBadProof, "nonce", "nonce %q does not prove %d bits of work for this challenge and key", clip(req.Nonce), payload[8]).
			WithHelp("the page solves it with scellisSolveJoin; a nonce solves one challenge for one key"))
		return
	}
	sig, err := base64.StdEncoding.DecodeString(req.Sig)
	if err != nil || !proof.VerifyJoin(pub, req.Challenge, req.Key, sig) {
		writeDiag(w, http.StatusForbidden, diag.New(diag.VolunteerBadProof, "sig", "the join message is not signed by the key being registered").
			WithHelp("the tab signs with the private half of the key it registers (scellisSolveJoin)"))
		return
	}
	if !s.seen.use(hex.EncodeToString(payload[9:]), exp, s.now()) {
		bad("the challenge was used already (a replay)")
		return
	}
	sess, d := s.newSession(req.Key, Prefix(clientIP(r), ReplicaPrefixV4, ReplicaPrefixV6))
	if d != nil {
		writeDiag(w, http.StatusServiceUnavailable, d)
		return
	}
	s.log.Info("volunteer joined", "peer", sess.Peer, "from", clientIP(r))
	writeJSON(w, http.StatusOK, sess)
}

// newSession opens a session for key joined from network origin.
func (s *Server) newSession(key, origin string) (Session, *diag.Diagnostic) {
	id, secret := make([]byte, 12), make([]byte, 32)
	if _, err := rand.Read(id); err != nil {
		return Session{}, diag.New(diag.VolunteerBadRequest, "session", "%v", err)
	}
	if _, err := rand.Read(secret); err != nil {
		return Session{}, diag.New(diag.VolunteerBadRequest, "session", "%v", err)
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, o := range s.sessions {
		if !now.Before(o.expiry) {
			delete(s.sessions, k)
		}
	}
	if len(s.sessions) >= s.opt.MaxSessions {
		return Session{}, diag.New(diag.VolunteerFull, "sessions", "this node holds %d volunteer sessions, its limit", len(s.sessions)).
			WithHelp("try again later, or open the volunteer page of another aggregator node")
	}
	ss := &session{secret: secret, key: key, peer: receipt.VolunteerPeer(key), origin: origin, expiry: now.Add(s.opt.SessionTTL)}
	s.sessions[hex.EncodeToString(id)] = ss
	return Session{Token: "vs1." + hex.EncodeToString(id) + "." + b64.EncodeToString(secret), Peer: ss.peer, Expires: ss.expiry.UnixMilli()}, nil
}

// authed admits a request carrying a live session token
// ("Authorization: Bearer vs1.…").
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		refuse := func(why string) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="scellis-volunteer"`)
			writeDiag(w, http.StatusUnauthorized, diag.New(diag.VolunteerNoSession, r.URL.Path, "%s", why).
				WithHelp("join again: the page asks for a challenge and solves it by itself (sessions last %s and do not survive a node restart)", s.opt.SessionTTL))
		}
		ss, why := s.sessionOf(r)
		if ss == nil {
			refuse(why)
			return
		}
		h(w, r, ss)
	}
}

// sessionOf finds the live session whose token r carries, or says why
// there is none.
func (s *Server) sessionOf(r *http.Request) (*session, string) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return nil, "no session token"
	}
	rest, ok := strings.CutPrefix(tok, "vs1.")
	id, sec64, ok2 := strings.Cut(rest, ".")
	secret, err := b64.DecodeString(sec64)
	if !ok || !ok2 || err != nil {
		return nil, "the session token is malformed"
	}
	s.mu.Lock()
	ss := s.sessions[id]
	s.mu.Unlock()
	// The secret is compared in constant time; the ID only finds the
	// session, like a user name.
	if ss == nil || subtle.ConstantTimeCompare(secret, ss.secret) != 1 {
		return nil, "the session token is unknown to this node"
	}
	if !s.now().Before(ss.expiry) {
		return nil, "the session expired"
	}
	return ss, ""
}

// SessionPeer names the volunteer (its peer name, vol:…) whose live
// session token r carries: the check the browser data plane is given
// (Options.DataPlane, dataplane.BrowserAuth.Check).
func (s *Server) SessionPeer(r *http.Request) (string, error) {
	ss, why := s.sessionOf(r)
	if ss == nil {
		return "", errors.New(why)
	}
	return ss.peer, nil
}

// limiter bounds joins per client address and for everyone.
// limiter bounds join requests per client, per client network and for
// everyone. The client is keyed by its address's /32 (IPv4) or /64
// (IPv6): an IPv6 subscriber gets at least a /64 and can use any address
// in it, so keying by the full address let one host pass the per-address
// limit with fresh addresses and use up the global budget; an IPv4
// address is already scarce, and a whole /24 often holds unrelated users
// (carrier NAT, a campus), so IPv4 is keyed by the address. The network
// tier (/24 IPv4, /48 IPv6: a site's allocation) allows blockFactor times
// the client's rate, so one site's many /64s cannot drain the global
// budget either. Each table holds at most maxKeys entries and drops the
// least recently used one when full, never the whole table: a flood of
// new keys cannot reset a client that keeps asking.
type limiter struct {
	mu      sync.Mutex
	per     rate.Limit
	burst   int
	global  *rate.Limiter
	clients *lruLimiters
	blocks  *lruLimiters
}

// The limiter's key prefixes, table bound and network-tier factor.
const (
	limitPrefixV4, limitPrefixV6 = 32, 64
	blockPrefixV4, blockPrefixV6 = 24, 48
	maxLimiterKeys               = 100000
	blockFactor                  = 10
)

func newLimiter(perMinute, burst, globalPerMinute int) *limiter {
	return &limiter{per: rate.Limit(float64(perMinute) / 60), burst: burst,
		global:  rate.NewLimiter(rate.Limit(float64(globalPerMinute)/60), max(burst, globalPerMinute/10)),
		clients: newLRULimiters(maxLimiterKeys), blocks: newLRULimiters(maxLimiterKeys)}
}

// allow says "" when a join request from ip may go on, else why not.
func (l *limiter) allow(ip string, now time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	client := l.clients.get(Prefix(ip, limitPrefixV4, limitPrefixV6), l.per, l.burst)
	block := l.blocks.get(Prefix(ip, blockPrefixV4, blockPrefixV6), l.per*blockFactor, l.burst*blockFactor)
	if !client.AllowN(now, 1) {
		return "too many join requests from this address"
	}
	if !block.AllowN(now, 1) {
		return "too many join requests from this address's network"
	}
	if !l.global.AllowN(now, 1) {
		return "too many join requests to this node from everyone at once"
	}
	return ""
}

// lruLimiters is a bounded table of rate limiters by key that, when full,
// drops the least recently used.
type lruLimiters struct {
	max   int
	byKey map[string]*list.Element
	order *list.List // front: most recently used
}

type keyedLimiter struct {
	key string
	lim *rate.Limiter
}

func newLRULimiters(n int) *lruLimiters {
	return &lruLimiters{max: n, byKey: map[string]*list.Element{}, order: list.New()}
}

// get returns key's limiter, made with r and burst if new, and marks it
// used.
func (t *lruLimiters) get(key string, r rate.Limit, burst int) *rate.Limiter {
	if e, ok := t.byKey[key]; ok {
		t.order.MoveToFront(e)
		return e.Value.(*keyedLimiter).lim
	}
	if t.order.Len() >= t.max {
		old := t.order.Back()
		t.order.Remove(old)
		delete(t.byKey, old.Value.(*keyedLimiter).key)
	}
	kl := &keyedLimiter{key: key, lim: rate.NewLimiter(r, burst)}
	t.byKey[key] = t.order.PushFront(kl)
	return kl.lim
}

// replay remembers used challenges until they expire.
type replay struct {
	mu   sync.Mutex
	used map[string]time.Time
}

// use marks challenge random value v used, reporting false if it was.
func (p *replay) use(v string, exp, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, e := range p.used {
		if !now.Before(e) {
			delete(p.used, k)
		}
	}
	if _, dup := p.used[v]; dup {
		return false
	}
	p.used[v] = exp
	return true
}
