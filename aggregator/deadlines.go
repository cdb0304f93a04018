package aggregator

import (
	"io"
	"net/http"
	"strings"
	"time"
)

// Deadlines of the API server. net/http's server-wide ReadTimeout and
// WriteTimeout would cut event streams and long polls, so withDeadlines sets
// them per request instead:
//
//   - headers: ReadHeaderTimeout (also bounds the TLS handshake);
//   - a request body: BodyTimeout, plus a second per MinBodyRate bytes of
//     its declared length (blobs are large), from the moment the handler
//     starts; a client that trickles bytes (one every few seconds) is cut
//     off there. The deadline is lifted once the body has been read, so a
//     handler that works long after reading is not cancelled;
//   - a response: WriteTimeout (plus the secure-aggregation long poll),
//     except the job event stream, which writes for as long as the job runs;
//   - between requests on a kept-alive connection: IdleTimeout.
const (
	ReadHeaderTimeout = 10 * time.Second
	IdleTimeout       = 2 * time.Minute
	WriteTimeout      = 2 * time.Minute
	// BlobWriteTimeout bounds a blob download (blobs are up to 64 MiB).
	BlobWriteTimeout = 15 * time.Minute
	MinBodyRate      = 64 << 10 // bytes per second
)

// DefaultBodyTimeout is Options.BodyTimeout's default.
const DefaultBodyTimeout = 30 * time.Second

func withDeadlines(h http.Handler, bodyTimeout, longPoll time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		// Errors mean the connection cannot take deadlines (a test
		// recorder); there is nothing to enforce then.
		if r.Body != nil && r.Body != http.NoBody {
			d := bodyTimeout
			if r.ContentLength > 0 {
				d += time.Duration(r.ContentLength/MinBodyRate) * time.Second
			} else if r.ContentLength < 0 { // chunked: as for the largest blob
				d += time.Duration((64<<20)/MinBodyRate) * time.Second
			}
			if rc.SetReadDeadline(time.Now().Add(d)) == nil {
				r.Body = &liftOnEOF{ReadCloser: r.Body, rc: rc}
			}
		}
		switch {
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/events"):
			rc.SetWriteDeadline(time.Time{}) // a stream: no end
		case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/blobs/"):
			rc.SetWriteDeadline(time.Now().Add(BlobWriteTimeout))
		default:
			rc.SetWriteDeadline(time.Now().Add(WriteTimeout + longPoll))
		}
		h.ServeHTTP(w, r)
	})
}

// liftOnEOF clears the connection's read deadline once the body is read:
// net/http then watches the connection for the client going away, and an
// expired deadline would cancel a handler that is still working.
type liftOnEOF struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *liftOnEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
