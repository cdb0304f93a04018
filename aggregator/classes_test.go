package aggregator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

// SC4003 on the real submission path: a bundle made by hand (no local
// admission, as a modified client would send it) that classes the job's
// model confidential is refused by the aggregator of an open pool through
// api.Server, and nothing changes; the same job unclassed is admitted.
func TestOpenPoolRefusesConfidentialModelBundle(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, trust.Open, 0, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alice := p.client("alice")
	plan := p.mustCompile(ctx, piJob("mc", 2000, 2))
	b := plan.Bundle()
	b.Classes = map[string]string{"model": "confidential"}
	raw, err := content.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := alice.PutBlob(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	before := p.node.Status().StateHash
	_, err = alice.Submit(ctx, ref)
	ds, ok := diag.As(err)
	if !ok || ds[0].Code != diag.OpenConfidential || !strings.Contains(ds[0].Message, "model") {
		t.Fatalf("a confidential model on an open pool: %v, want SC4003", err)
	}
	if after := p.node.Status().StateHash; after != before {
		t.Fatal("the refused submission changed the coordinator state")
	}
	// The same job, unclassed, is admitted: the refusal was the class.
	if _, err := submit(ctx, alice, p.fed, plan); err != nil {
		t.Fatalf("the unclassed job: %v", err)
	}
}
