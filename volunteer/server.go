// Package volunteer serves the volunteer page of an aggregator node: a
// browser tab that computes shards of open jobs in the shard executor
// compiled to WebAssembly (cmd/scellis-wasm), and the small API it talks
// to over HTTPS — join (proof of work, an ephemeral Ed25519 key), lease,
// shard, release, result. The page and its scripts are embedded; the
// .wasm is the operator's build (docs/volunteers.md).
//
// Invariant: a volunteer can do nothing a member can but execute shards
// of open jobs that are not training rounds (the coordinator enforces the
// job rule, coordinator.volunteerMay): it leases, renews, releases and
// reports as the peer named after its key (receipt.VolunteerPeer), its
// reports are signed by that key, and every refusal is a diagnostic.
package volunteer

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

//go:embed assets
var assets embed.FS

// Backend is the node the page's work goes to.
type Backend interface {
	// Apply proposes a command through Raft; a follower answers
	// *api.NotLeaderError.
	Apply(ctx context.Context, cmd coordinator.Command) (api.Applied, error)
	Regime() trust.Regime
	Jobs() []coordinator.JobStatus
	Job(id content.Ref) (coordinator.JobStatus, error)
	RevealOpen(job content.Ref, shard int, now int64) (bool, int64)
	// Leasable is how many shards a lease by peer at now would get, from
	// the local replica: an idle tab's poll costs no log entry.
	Leasable(peer string, now int64) int
	// Blob returns a blob's bytes (checked against ref).
	Blob(ctx context.Context, ref content.Ref) ([]byte, error)
	// PutBlob stores b and returns once it is durable (on a majority).
	PutBlob(ctx context.Context, b []byte) (content.Ref, error)
}

// Options configure a volunteer server; zero fields take the defaults.
type Options struct {
	// Wasm is the path of the operator's scellis.wasm build; WasmExec the
	// wasm_exec.js of the same Go toolchain (default: beside Wasm).
	Wasm, WasmExec string
	// Difficulty is the join proof of work in leading zero bits.
	Difficulty int
	// JoinsPerMinute and JoinBurst bound challenges and joins per client
	// (an IPv4 address, an IPv6 /64), ten times them per network (/24,
	// /48: limiter); GlobalJoinsPerMinute bounds them for everyone
	// together.
	JoinsPerMinute, JoinBurst, GlobalJoinsPerMinute int
	// SessionTTL is a session token's life; MaxSessions bounds the live
	// ones.
	SessionTTL  time.Duration
	MaxSessions int
	// CommitReveal: the pool's coordinator wants commitments before
	// reports (aggregator.Options.NoCommitReveal unset).
	CommitReveal bool
	// MaxLeases caps the live leases one volunteer holds at once
	// (coordinator.Lease.Hold; 0: coordinator.DefaultVolunteerLeases).
	MaxLeases int
	// Pool names the federation on the page.
	Pool string
	// DataPlane, when set, is the browser data plane
	// (aggregator.Node.BrowserDataPlane, checking tokens with
	// SessionPeer), served beside the page: /p2p/browser/ (the module,
	// ICE servers, signalling) and /blobs/ (its HTTPS fallback).
	DataPlane http.Handler
}

// Defaults.
const (
	DefaultDifficulty  = 18
	DefaultSessionTTL  = time.Hour
	DefaultMaxSessions = 10000
	challengeTTL       = 2 * time.Minute
	maxResultBytes     = 8 << 20
)

// BuildCommand is how an operator builds the worker the page serves.
const BuildCommand = `GOOS=js GOARCH=wasm go build -o scellis.wasm ./cmd/scellis-wasm && cp "$(go env GOROOT)/lib/wasm/wasm_exec.js" .`

// Server serves one node's volunteer page and API.
type Server struct {
	be   Backend
	opt  Options
	log  *slog.Logger
	now  func() time.Time
	mac  []byte // the challenge MAC key, made at start, never leaves the process
	lim  *limiter
	seen *replay

	// life ends with Close: it bounds the reveals the node still owes
	// tabs that went away (result).
	life context.Context
	end  context.CancelFunc

	mu       sync.Mutex
	sessions map[string]*session // by session ID
	bundles  map[content.Ref]*bundleReq
}

// New returns a volunteer server over be. It checks that the wasm files
// can be read, so a wrong path is refused at start.
func New(be Backend, opt Options, log *slog.Logger) (*Server, error) {
	if opt.Difficulty == 0 {
		opt.Difficulty = DefaultDifficulty
	}
	if opt.JoinsPerMinute == 0 {
		opt.JoinsPerMinute = 6
	}
	if opt.JoinBurst == 0 {
		opt.JoinBurst = 4
	}
	if opt.GlobalJoinsPerMinute == 0 {
		opt.GlobalJoinsPerMinute = 600
	}
	if opt.SessionTTL == 0 {
		opt.SessionTTL = DefaultSessionTTL
	}
	if opt.MaxSessions == 0 {
		opt.MaxSessions = DefaultMaxSessions
	}
	if opt.WasmExec == "" && opt.Wasm != "" {
		opt.WasmExec = siblingExec(opt.Wasm)
	}
	for _, f := range []string{opt.Wasm, opt.WasmExec} {
		if _, err := os.Stat(f); err != nil {
			return nil, diag.New(diag.WorkerConfig, "volunteer_wasm", "the volunteer page needs the worker compiled to WebAssembly and Go's wasm_exec.js: %v", err).
				WithHelp("build them with: %s — and set volunteer_wasm to the .wasm's path (wasm_exec.js beside it)", BuildCommand)
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mac := make([]byte, 32)
	if _, err := rand.Read(mac); err != nil {
		return nil, err
	}
	life, end := context.WithCancel(context.Background())
	return &Server{be: be, opt: opt, log: log, now: time.Now, mac: mac, life: life, end: end,
		lim:      newLimiter(opt.JoinsPerMinute, opt.JoinBurst, opt.GlobalJoinsPerMinute),
		seen:     &replay{used: map[string]time.Time{}},
		sessions: map[string]*session{}, bundles: map[content.Ref]*bundleReq{}}, nil
}

// Close ends the reveals the node still owes tabs whose requests ended
// (see result); the node calls it when it stops serving the page.
func (s *Server) Close() { s.end() }

// Routes of the volunteer API (docs/api.md lists them).
var Routes = []string{
	"GET /volunteer/v1/project",
	"POST /volunteer/v1/challenge",
	"POST /volunteer/v1/join",
	"POST /volunteer/v1/lease",
	"GET /volunteer/v1/shard",
	"POST /volunteer/v1/release",
	"POST /volunteer/v1/results",
}

// Handler serves the page, its scripts, the operator's wasm and the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(assets, "assets")
	static := http.FileServerFS(sub)
	mux.Handle("GET /", noStore(static))
	mux.HandleFunc("GET /scellis.wasm", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/wasm")
		http.ServeFile(w, r, s.opt.Wasm)
	})
	mux.HandleFunc("GET /wasm_exec.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		http.ServeFile(w, r, s.opt.WasmExec)
	})
	hs := map[string]http.HandlerFunc{
		Routes[0]: s.project,
		Routes[1]: s.challenge,
		Routes[2]: s.join,
		Routes[3]: s.authed(s.lease),
		Routes[4]: s.authed(s.shard),
		Routes[5]: s.authed(s.release),
		Routes[6]: s.authed(s.result),
	}
	if s.opt.DataPlane != nil {
		// Method-qualified, so that none overlaps "GET /" ambiguously.
		for _, p := range []string{"GET /p2p/browser/", "POST /p2p/browser/", "GET /blobs/", "PUT /blobs/"} {
			mux.Handle(p, s.opt.DataPlane)
		}
	}
	for _, rt := range Routes {
		h := hs[rt]
		mux.HandleFunc(rt, func(w http.ResponseWriter, r *http.Request) {
			limit := int64(16 << 10)
			if rt == Routes[6] {
				limit = maxResultBytes*4/3 + 16<<10 // base64 result bytes
			}
			r.Body = http.MaxBytesReader(w, r.Body, limit)
			h(w, r)
		})
	}
	return securityHeaders(mux)
}

// securityHeaders: the page loads only its own scripts and the wasm, and
// talks only to this origin; content running in the wasm has no builtins
// to reach anything anyway (script/).
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; connect-src 'self'; worker-src 'self'; img-src 'self' data:; style-src 'self'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

func noStore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

func siblingExec(wasm string) string {
	dir := wasm
	for i := len(dir) - 1; i >= 0; i-- {
		if dir[i] == '/' {
			return dir[:i+1] + "wasm_exec.js"
		}
	}
	return "wasm_exec.js"
}

// decode reads a bounded JSON body, refusing unknown fields and trailing
// data (api.DecodeJSON).
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return api.DecodeJSON(w, r, v, diag.VolunteerBadRequest, "the volunteer page sends these requests by itself; reload it")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeDiag(w http.ResponseWriter, status int, d *diag.Diagnostic) {
	writeDiags(w, status, diag.List{d})
}

func writeDiags(w http.ResponseWriter, status int, ds diag.List) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	diag.RenderJSON(w, ds)
}
