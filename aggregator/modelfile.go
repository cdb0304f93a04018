package aggregator

import (
	"context"
	"errors"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl/account"
	"github.com/scellis/scellis/identity"
)

// exportModel implements api.Server.Model: the run's model file, assembled
// from this node's replica (its job states, receipts and blobs, read as
// viewer may read them) and signed with this node's identity key. The
// signature is the node's statement that the file is what the cluster's
// replicated state holds for the run; a client cannot assemble a file the
// cluster's key signs.
func (n *Node) exportModel(ctx context.Context, run content.Ref, viewer identity.Member) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	m := n.fsm.machine()
	st, err := m.Run(run)
	if err != nil {
		return nil, err
	}
	src := api.ViewerSource{Read: readerOf{n.fsm}, Blobs: n.fetchBlob, Viewer: viewer}
	f, err := account.NewReader(src, n.fed).ModelFile(ctx, st, m.Receipts(0))
	if errors.Is(err, account.ErrNoModel) {
		return nil, diag.New(diag.RunBadRound, string(run), "run %s has no completed step yet: no model to export", st.Name).
			WithHelp("wait for its first round (scellis fl watch %s)", run)
	}
	if err != nil {
		return nil, err
	}
	return f.Sign(n.id, n.Self.Name)
}
