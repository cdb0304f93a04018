package blob

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// Handler serves the store over HTTP, apart from the coordinator API:
//
//	PUT /blobs/{ref}     store the body under ref (refused unless it hashes to ref)
//	POST /blobs/batch    store several blobs at once (PutBatch), answer their refs
//	GET /blobs/{ref}     the bytes
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
	mux.HandleFunc("POST /blobs/batch", func(w http.ResponseWriter, r *http.Request) {
		if !authorize(w, r) {
			return
		}
		// The whole batch is bounded like one blob.
		r.Body = http.MaxBytesReader(w, r.Body, s.maxSize+1)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			if isMaxBytes(err) {
				refuse(w, http.StatusRequestEntityTooLarge, diag.New(diag.BlobRefused, "blob batch", "a batch exceeds %d bytes", s.maxSize).
					WithHelp("send fewer or smaller blobs per batch, or PUT them one by one"))
				return
			}
			refuse(w, http.StatusBadRequest, diag.New(diag.BlobRefused, "blob batch", "reading the batch: %v", err))
			return
		}
		var blobs [][]byte
		if err := content.Decode(body, &blobs); err != nil {
			refuse(w, http.StatusBadRequest, diag.New(diag.BlobRefused, "blob batch", "the body is not a canonical CBOR array of byte strings: %v", err).
				WithHelp("send content.Encode([][]byte{…})"))
			return
		}
		if len(blobs) == 0 || len(blobs) > MaxBatch {
			refuse(w, http.StatusBadRequest, diag.New(diag.BlobRefused, "blob batch", "a batch holds %d blobs; it must hold 1 to %d", len(blobs), MaxBatch).
				WithHelp("send at most %d blobs per batch", MaxBatch))
			return
		}
		refs, err := s.PutBatch(blobs)
		if err != nil {
			refuse(w, http.StatusInternalServerError, diag.New(diag.BlobRefused, "blob batch", "storing failed: %v", err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(BatchStored{Refs: refs})
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
		// Streamed from its file: a model blob is fetched by every silo at
		// once, and a copy in memory per request grew an aggregator's
		// peak with the number of silos (issue 32).
		b, size, err := s.Open(ref)
		if errors.Is(err, ErrNotFound) {
			refuse(w, http.StatusNotFound, diag.New(diag.BlobMissing, ref.Short(), "no blob %s here", ref).
				WithHelp("upload it first"))
			return
		}
		if err != nil {
			refuse(w, http.StatusInternalServerError, diag.New(diag.BlobMissing, ref.Short(), "%v", err))
			return
		}
		defer b.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", fmt.Sprint(size))
		io.Copy(w, b)
	})
	return mux
}

// MaxBatch bounds the blobs of one POST /blobs/batch.
const MaxBatch = 256

// BatchStored answers POST /blobs/batch: the ref of each blob, in order,
// each stored durably (as PUT) before the answer.
type BatchStored struct {
	Refs []content.Ref `json:"refs"`
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
