package blob

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Handler serves the store over HTTP, apart from the coordinator API:
//
//	PUT /blobs/{ref}   store the body under ref (refused unless it hashes to ref)
//	GET /blobs/{ref}   the bytes
//
// authorize decides whether the (already TLS-authenticated) caller may use
// the store; it writes its own refusal when it returns false.
func Handler(s *Store, authorize func(w http.ResponseWriter, r *http.Request) bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /blobs/{ref}", func(w http.ResponseWriter, r *http.Request) {
		if !authorize(w, r) {
			return
		}
		ref, err := content.ParseRef(r.PathValue("ref"))
		if err != nil {
			refuse(w, http.StatusBadRequest, diag.New(diag.BlobRefused, "blob", "%v", err))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.maxSize+1)
		switch err := s.Put(ref, r.Body); {
		case err == nil:
			w.WriteHeader(http.StatusCreated)
		case errors.Is(err, ErrHashMismatch):
			refuse(w, http.StatusBadRequest, diag.New(diag.BlobRefused, ref.Short(), "the uploaded bytes do not hash to %s", ref).
				WithHelp("upload exactly the bytes the ref names"))
		case errors.Is(err, ErrTooLarge), isMaxBytes(err):
			refuse(w, http.StatusRequestEntityTooLarge, diag.New(diag.BlobRefused, ref.Short(), "blob exceeds %d bytes", s.maxSize).
				WithHelp("results should be summaries; split large outputs into more shards"))
		default:
			refuse(w, http.StatusInternalServerError, diag.New(diag.BlobRefused, ref.Short(), "storing failed: %v", err))
		}
	})
	mux.HandleFunc("GET /blobs/{ref}", func(w http.ResponseWriter, r *http.Request) {
		if !authorize(w, r) {
			return
		}
		ref, err := content.ParseRef(r.PathValue("ref"))
		if err != nil {
			refuse(w, http.StatusBadRequest, diag.New(diag.BlobRefused, "blob", "%v", err))
			return
		}
		b, err := s.Get(ref)
		if errors.Is(err, ErrNotFound) {
			refuse(w, http.StatusNotFound, diag.New(diag.BlobMissing, ref.Short(), "no blob %s here", ref).
				WithHelp("upload it first"))
			return
		}
		if err != nil {
			refuse(w, http.StatusInternalServerError, diag.New(diag.BlobMissing, ref.Short(), "%v", err))
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b)
	})
	return mux
}

func isMaxBytes(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

func refuse(w http.ResponseWriter, status int, d *diag.Diagnostic) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	diag.RenderJSON(w, diag.List{d})
}
