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
	b, err := n.fetchBlob(ctx, ref)
	if err != nil {
		return err
	}
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
