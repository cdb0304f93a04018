package aggregator

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"slices"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/testfault"
	"github.com/scellis/scellis/secagg"
)

// The delegate loop's test faults (package testfault): a child that
// misbehaves on purpose in one hierarchical round, so that the
// multi-process tests see the other parties catch it through the real
// binaries. Inert outside a test build.

// badOuterKey returns the outer key a child armed with
// testfault.BadOuterKey posts for the parent round job named job instead
// of its own: the all-zero X25519 point, signed with the child's
// delegate key (so the parent's host, which checks signatures, takes
// it). Nil when the fault does not fire here.
func (g *delegator) badOuterKey(job string, own *secagg.OuterKey) *secagg.OuterKey {
	if !testfault.Fires(testfault.BadOuterKey, job) {
		return nil
	}
	k := *own
	k.Key = make([]byte, len(own.Key))
	k.Sign(g.d.Identity.PrivateKey())
	g.n.log.Warn("test fault: posting an outer key of the all-zero point", "fault", testfault.BadOuterKey, "round job", job, "round", k.Parent)
	return &k
}

// ownKeyBack puts this child's real key back in its place in the set the
// host published, where the host holds the bad key the child posted: the
// faulty child masks with its real key (only the other children see the
// bad one, and refuse it).
func ownKeyBack(keys []secagg.OuterKey, own *secagg.OuterKey) []secagg.OuterKey {
	keys = slices.Clone(keys)
	for i := range keys {
		if keys[i].Cluster == own.Cluster && keys[i].Round == own.Round {
			keys[i] = *own
		}
	}
	return keys
}

// forgedBundle returns, for a child armed with
// testfault.ForgeRoundBundle for parent round job pj, the ref of a
// forged copy of its round bundle, stored and made durable in this
// cluster: the parent's bundle with an X25519 key of this child's in its
// sub-cohort's Params.Parent. Its silos read it through this child, as
// they read the true one. The empty ref when the fault does not fire here.
func (g *delegator) forgedBundle(ctx context.Context, pj *parentJob) (content.Ref, error) {
	if !testfault.Fires(testfault.ForgeRoundBundle, pj.st.Name) {
		return "", nil
	}
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	b := pj.round.b
	b.SubCohorts = slices.Clone(b.SubCohorts)
	for i := range b.SubCohorts {
		if b.SubCohorts[i].Cluster == g.d.Name {
			b.SubCohorts[i].SecAgg.Parent = priv.PublicKey().Bytes()
		}
	}
	raw, err := content.Encode(&b)
	if err != nil {
		return "", err
	}
	ref, err := g.n.blobs.PutBytes(raw)
	if err != nil {
		return "", err
	}
	if err := g.n.durable(ctx, ref); err != nil {
		return "", err
	}
	g.n.log.Warn("test fault: serving the silos a forged round bundle", "fault", testfault.ForgeRoundBundle, "round job", pj.st.Name, "bundle", ref.Short(), "parent's bundle", pj.st.Bundle.Short())
	return ref, nil
}
