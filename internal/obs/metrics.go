package obs

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry of the process's own — never the global
// default, so that several nodes in one test process do not collide —
// holding the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg in the Prometheus exposition format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// Server is a plain-HTTP listener for /metrics (and, on an aggregator
// whose health_listen is the same address, /healthz and /readyz).
type Server struct {
	srv  *http.Server
	done chan struct{}
	Addr string // the address it listens on (the port chosen, for ":0")
}

// Listen serves mux on addr until Close.
func Listen(addr string, mux http.Handler, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, ErrorLog: HTTPErrorLog(log)},
		done: make(chan struct{}),
		Addr: ln.Addr().String(),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "addr", addr, "err", err)
		}
	}()
	return s, nil
}

// Close stops the server and waits for it.
func (s *Server) Close() {
	s.srv.Close()
	<-s.done
}

// CountBytes wraps h so that the bytes of every request body read and
// every response body written are added to in and out.
func CountBytes(h http.Handler, in, out prometheus.Counter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n atomic.Int64
		if r.Body != nil {
			r.Body = &countingBody{ReadCloser: r.Body, n: &n}
		}
		cw := &countingWriter{ResponseWriter: w}
		h.ServeHTTP(cw, r)
		in.Add(float64(n.Load()))
		out.Add(float64(cw.n))
	})
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	b.n.Add(int64(k))
	return k, err
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (w *countingWriter) Write(p []byte) (int, error) {
	k, err := w.ResponseWriter.Write(p)
	w.n += int64(k)
	return k, err
}

// Unwrap lets http.ResponseController reach the connection (deadlines,
// flushes) through the counter.
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes flushes on (long polls and event streams flush).
func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// CountTransport wraps a client transport so that the bytes of request
// bodies sent are added to out and of response bodies read to in.
func CountTransport(rt http.RoundTripper, in, out prometheus.Counter) http.RoundTripper {
	return countingTransport{rt: rt, in: in, out: out}
}

type countingTransport struct {
	rt      http.RoundTripper
	in, out prometheus.Counter
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var sent atomic.Int64
	if r.Body != nil {
		r2 := r.Clone(r.Context())
		r2.Body = &countingBody{ReadCloser: r.Body, n: &sent}
		r = r2
	}
	resp, err := t.rt.RoundTrip(r)
	t.out.Add(float64(sent.Load()))
	if err != nil {
		return nil, err
	}
	resp.Body = &countedResponse{ReadCloser: resp.Body, c: t.in}
	return resp, nil
}

// countedResponse adds what is read of a response body to c.
type countedResponse struct {
	io.ReadCloser
	c prometheus.Counter
}

func (b *countedResponse) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	b.c.Add(float64(k))
	return k, err
}
