package aggregator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/scellis/scellis/blob"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Blob durability across the cluster. Workers upload a result to whichever
// aggregator they talk to; before the leader proposes the result's hash it
// makes sure the bytes are on this node and on at least one other, so a
// verified result — and the receipt minted for it — never depends on a
// single disk. Content a submitter uploaded to one node is fetched from the
// others when another node needs it (a new leader planning or reducing).

// peers returns the other aggregators' base URLs.
func (n *Node) peers() []string {
	var out []string
	for _, m := range n.fed.ByRole(identity.Aggregator) {
		if m.Name != n.Self.Name {
			out = append(out, "https://"+m.Address)
		}
	}
	return out
}

// fetchBlob returns a blob from the local store, or from another node
// (keeping a local copy).
func (n *Node) fetchBlob(ctx context.Context, ref content.Ref) ([]byte, error) {
	b, err := n.blobs.Get(ref)
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, blob.ErrNotFound) || n.peerClient == nil {
		return nil, err
	}
	b, err = n.peerClient.GetBlobFrom(ctx, n.peers(), ref)
	if err != nil {
		return nil, fmt.Errorf("blob %s is on no reachable aggregator: %w", ref.Short(), err)
	}
	if _, err := n.blobs.PutBytes(b); err != nil {
		return nil, err
	}
	return b, nil
}

// durable makes sure ref is stored here and on at least one other node
// (when the cluster has others). The copies go to every peer at once, each
// upload with its own progress deadline, and the first that is stored
// suffices: a peer that is down or silent never holds up a healthy one.
func (n *Node) durable(ctx context.Context, ref content.Ref) error {
	peers := n.peers()
	if len(peers) == 0 && n.blobs.Has(ref) {
		return nil // a single node: stored here is all there is
	}
	if n.earlyCopied(ctx, ref) {
		return nil // copied when it was uploaded (earlycopy.go)
	}
	b, err := n.fetchBlob(ctx, ref)
	if err != nil {
		return err
	}
	return n.replicate(ctx, ref, b)
}

// replicate stores b, whose ref is ref and which is stored here, on at
// least one other node (durable's second half).
func (n *Node) replicate(ctx context.Context, ref content.Ref, b []byte) error {
	peers := n.peers()
	if len(peers) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel() // the other uploads are not needed once one copy is stored
	results := make(chan error, len(peers))
	for _, p := range peers {
		go func() { results <- n.peerClient.PutBlobTo(ctx, p, b) }()
	}
	var errs []error
	for range peers {
		err := <-results
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	// Not an input fault: the cluster cannot keep the blob safe, which is
	// what a majority down looks like from here (SC7103, as the client
	// says when no node answers).
	return diag.New(diag.PoolNoLeader, "cluster", "no second aggregator took a copy of %s: %v", ref.Short(), errors.Join(errs...)).
		WithHelp("the other aggregators are down or unreachable from this one; a job is accepted once a second node holds its blobs (scellis aggregator status)")
}

// durableBatchBytes bounds one batched copy to a peer; a larger blob is
// copied alone.
const durableBatchBytes = 4 << 20

// durableAll is durable for the results of a batched report: the blobs
// that are here go to the other nodes together (POST /blobs/batch, up to
// durableBatchBytes a request, the first peer that stores a group
// suffices, as for one blob), so a batch of small results costs one copy
// request, not one per result. Whatever a batched copy could not place
// (a peer without the batch endpoint, a large blob) goes through durable,
// blob by blob. It returns one error per ref, nil when durable.
func (n *Node) durableAll(ctx context.Context, refs []content.Ref) []error {
	errs := make([]error, len(refs))
	peers := n.peers()
	var group [][]byte
	var at []int // the ref of each blob in group
	size := 0
	flush := func() {
		if len(group) == 0 {
			return
		}
		if !n.copyToAPeer(ctx, peers, group) {
			for _, i := range at {
				errs[i] = n.durable(ctx, refs[i])
			}
		}
		group, at, size = nil, nil, 0
	}
	for i, ref := range refs {
		if n.earlyCopied(ctx, ref) {
			continue // copied when it was uploaded (earlycopy.go)
		}
		if len(peers) == 0 || n.peerClient == nil {
			errs[i] = n.durable(ctx, ref)
			continue
		}
		b, err := n.fetchBlob(ctx, ref)
		if err != nil {
			errs[i] = err
			continue
		}
		if len(b) > durableBatchBytes/4 {
			errs[i] = n.durable(ctx, ref)
			continue
		}
		if size+len(b) > durableBatchBytes || len(group) == blob.MaxBatch {
			flush()
		}
		group, at, size = append(group, b), append(at, i), size+len(b)
	}
	flush()
	return errs
}

// copyToAPeer stores bs on at least one of peers in one request each,
// sent to all at once; false when none took them.
func (n *Node) copyToAPeer(ctx context.Context, peers []string, bs [][]byte) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel() // the other copies are not needed once one is stored
	results := make(chan error, len(peers))
	for _, p := range peers {
		go func() { results <- n.peerClient.PutBlobsTo(ctx, p, bs) }()
	}
	for range peers {
		if err := <-results; err == nil {
			return true
		}
	}
	return false
}
