package api

import (
	"context"
	"net/http"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// A run's model file is assembled by the node that answers, from its own
// replica, and signed with its identity key (fl.ModelFile.Sign): the
// signature says which node of the cluster exported it from replicated
// state, so a file edited on the way, or made up, does not verify
// (`scellis model verify`).

// MaxModelFile bounds the model file a node sends (the reader's bound,
// safefile.MaxDataset): a file of a large model's whole strategy state
// outgrows an API response's usual bound.
const MaxModelFile = 1 << 30

func (s *Server) runModel(w http.ResponseWriter, r *http.Request) {
	id, ok := s.jobID(w, r)
	if !ok {
		return
	}
	if s.Model == nil {
		writeDiag(w, http.StatusNotImplemented, diag.New(diag.PoolBadRequest, "runs", "this node does not export model files"))
		return
	}
	b, err := s.Model(r.Context(), id, peerOf(r))
	if err != nil {
		s.writeRead(w, r, nil, err)
		return
	}
	// The body is the file itself, byte for byte as the node signed it.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// RunModel asks a node for a run's model file, assembled and signed by
// that node (fl.ParseModelFile checks it).
func (c *Client) RunModel(ctx context.Context, id content.Ref) ([]byte, error) {
	var b []byte
	err := c.do(context.WithValue(ctx, responseLimitKey{}, int64(MaxModelFile)), "GET", "/v1/runs/"+string(id)+"/model", nil, &b)
	return b, err
}

// ViewerSource reads a node's replica as viewer sees it through the API:
// job states with undecided results redacted (as GET /v1/jobs/{id}) and
// only the blobs BlobReadable lets viewer read. A model file assembled
// from it (package fl/account's Source) holds no more than the viewer
// could read itself.
type ViewerSource struct {
	Read   Reader
	Blobs  func(ctx context.Context, ref content.Ref) ([]byte, error)
	Viewer identity.Member
}

// Job is the job's status as the viewer may see it.
func (v ViewerSource) Job(_ context.Context, id content.Ref) (coordinator.JobStatus, error) {
	js, err := v.Read.Job(id)
	if err == nil {
		redactJob(&js, v.Viewer)
	}
	return js, err
}

// Blob is the blob's bytes when the viewer may read them.
func (v ViewerSource) Blob(ctx context.Context, ref content.Ref) ([]byte, error) {
	if !BlobReadable(v.Read.ResultUse(ref), v.Viewer) {
		return nil, diag.New(diag.PoolForbidden, string(ref), "%s may not read blob %s (an undecided result, or an open pool's result of another member's job)", v.Viewer.Name, ref.Short())
	}
	return v.Blobs(ctx, ref)
}
