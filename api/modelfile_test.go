package api

import (
	"context"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// oneJobReader serves one job and says every blob is an undecided result.
type oneJobReader struct {
	Reader
	js coordinator.JobStatus
}

func (r oneJobReader) Job(content.Ref) (coordinator.JobStatus, error) { return r.js, nil }
func (r oneJobReader) ResultUse(content.Ref) coordinator.ResultUse {
	return coordinator.ResultUse{Undecided: true}
}

// A model file is assembled from what its asker could read through the API
// (law 13): a researcher's view of a job has undecided results redacted
// and undecided result bytes refused; an aggregator's has both.
func TestViewerSourceReadsAsTheViewer(t *testing.T) {
	secret := content.Hash([]byte("an undecided result"))
	js := coordinator.JobStatus{Shards: []coordinator.ShardStatus{{State: coordinator.StatePending, Reports: []coordinator.ReportInfo{{Peer: "h1", Result: secret}}}}}
	blobs := func(context.Context, content.Ref) ([]byte, error) { return []byte("bytes"), nil }
	ctx := context.Background()

	researcher := ViewerSource{Read: oneJobReader{js: js}, Blobs: blobs, Viewer: identity.Member{Name: "alice", Role: identity.Researcher}}
	got, err := researcher.Job(ctx, "")
	if err != nil || got.Shards[0].Reports[0].Result != "" {
		t.Fatalf("a researcher sees an undecided result: %v %+v", err, got.Shards[0].Reports)
	}
	if _, err := researcher.Blob(ctx, secret); err == nil {
		t.Fatal("a researcher read an undecided result's bytes")
	} else if ds, ok := diag.As(err); !ok || ds[0].Code != diag.PoolForbidden {
		t.Fatalf("refused without SC7108: %v", err)
	}

	js.Shards[0].Reports[0].Result = secret // redaction worked on a copy's slice
	agg := ViewerSource{Read: oneJobReader{js: js}, Blobs: blobs, Viewer: identity.Member{Name: "agg-1", Role: identity.Aggregator}}
	if got, _ := agg.Job(ctx, ""); got.Shards[0].Reports[0].Result != secret {
		t.Fatal("an aggregator's view lost a result")
	}
	if b, err := agg.Blob(ctx, secret); err != nil || string(b) != "bytes" {
		t.Fatalf("an aggregator could not read a result: %v", err)
	}
}
