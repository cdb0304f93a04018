package secagg

import (
	"cmp"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"slices"
	"strings"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// The outer mask of a hierarchical round (docs/secagg.md, "The outer
// mask"). Without it the parent, which removes each sub-cohort's masks,
// learns every sub-cohort's sum. With it, each child i of a round of two
// or more sub-cohorts draws a fresh X25519 key e_i, signs its public half
// with its delegate identity (the Ed25519 key the parent's federation
// lists for the child cluster), and, once it holds every other child's
// signed key, adds
//
//	R_i = Σ_{j≠i} Δ_ij·PRG(s_ij),  s_ij = HKDF(X25519(e_i, e_j), salt, i, j)
//
// to the masked sum it forwards (Δ_ij = +1 when i's cluster sorts before
// j's, −1 after, so Σ_i R_i = 0). The parent removes each sub-cohort's
// site masks as before and adds the resulting ring words into one total
// (Parent): each sub-cohort's ring sum is its plaintext sum plus R_i,
// uniform to anyone without an e_j, and only the total decodes. The outer
// layer needs no dropout recovery: the parent releases nothing while a
// sub-cohort is missing, and a child that fails makes the whole round
// run again under a new ID (with fresh keys).

const (
	labelOuterKey  = "scellis/secagg/v1/outer-key"
	labelOuterSalt = "scellis/secagg/v1/outer-salt"
	labelOuterMask = "scellis/secagg/v1/outer-mask"
)

// SubCohort names one sub-cohort of a hierarchical round: its round ID
// and the child cluster (its member name in the parent's federation) that
// hosts it.
type SubCohort struct {
	Round   string `cbor:"round"`
	Cluster string `cbor:"cluster"`
}

// OuterKey is a child's signed outer-mask key for one hierarchical round:
// the public half of its fresh X25519 key, bound to the parent round, its
// sub-cohort and its cluster by an Ed25519 signature of the cluster's
// delegate identity.
type OuterKey struct {
	Parent  string `cbor:"parent"`
	Round   string `cbor:"round"`
	Cluster string `cbor:"cluster"`
	Key     []byte `cbor:"key"`
	Sig     []byte `cbor:"sig"`
}

// OuterKeys is the set of the children's outer keys of one round, as the
// parent's host publishes it.
type OuterKeys struct {
	Keys []OuterKey `cbor:"keys"`
}

// outerStatement is what a child signs.
func outerStatement(k *OuterKey) []byte {
	return mustEncode([]any{labelOuterKey, k.Parent, k.Round, k.Cluster, k.Key})
}

func (k *OuterKey) validate() error {
	const what = "outer key"
	if err := checkRoundID(what, k.Parent); err != nil {
		return err
	}
	if err := checkRoundID(what, k.Round); err != nil {
		return err
	}
	if err := checkID(what, "cluster", k.Cluster); err != nil {
		return err
	}
	if err := checkLen(what, "key", k.Key, keySize); err != nil {
		return err
	}
	return checkLen(what, "signature", k.Sig, ed25519.SignatureSize)
}

// Verify reports whether k is signed by pub (the delegate key of
// k.Cluster).
func (k *OuterKey) Verify(pub ed25519.PublicKey) bool {
	return len(pub) == ed25519.PublicKeySize && len(k.Sig) == ed25519.SignatureSize && ed25519.Verify(pub, outerStatement(k), k.Sig)
}

// Sign signs k with delegate, the delegate identity of k.Cluster.
func (k *OuterKey) Sign(delegate ed25519.PrivateKey) {
	k.Sig = ed25519.Sign(delegate, outerStatement(k))
}

// Marshal returns the canonical encoding of the key.
func (k *OuterKey) Marshal() ([]byte, error) { return content.Encode(k) }

// ParseOuterKey parses the canonical encoding of an OuterKey.
func ParseOuterKey(b []byte) (*OuterKey, error) { return parse("outer key", b, new(OuterKey)) }

// Marshal returns the canonical encoding of the set.
func (m *OuterKeys) Marshal() ([]byte, error) { return content.Encode(m) }

func (m *OuterKeys) validate() error {
	if len(m.Keys) > MaxSitesPlus {
		return malformed("outer keys", "%d keys", len(m.Keys))
	}
	for i := range m.Keys {
		if err := m.Keys[i].validate(); err != nil {
			return err
		}
	}
	return nil
}

// ParseOuterKeys parses the canonical encoding of an OuterKeys.
func ParseOuterKeys(b []byte) (*OuterKeys, error) { return parse("outer keys", b, new(OuterKeys)) }

// OuterMask is one child's outer layer of one hierarchical round. Its
// private key lives in memory only, for one Apply.
type OuterMask struct {
	priv *ecdh.PrivateKey
	key  OuterKey
}

// NewOuterMask draws the child's outer key for its sub-cohort round of
// the hierarchical round parent, served by cluster, and signs it with the
// cluster's delegate identity.
func NewOuterMask(parent, round, cluster string, delegate ed25519.PrivateKey) (*OuterMask, error) {
	if len(delegate) != ed25519.PrivateKeySize {
		return nil, diag.New(diag.SecAggBadParams, fmt.Sprintf("hierarchical secure aggregation round %q", parent), "no delegate identity to sign the outer key").
			WithHelp("the child signs with its delegate_identity key")
	}
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	o := &OuterMask{priv: priv, key: OuterKey{Parent: parent, Round: round, Cluster: cluster, Key: priv.PublicKey().Bytes()}}
	o.key.Sign(delegate)
	if err := o.key.validate(); err != nil {
		return nil, err
	}
	return o, nil
}

// Key returns the signed public key to publish to the other children
// (through the parent's host, which needs nothing else).
func (o *OuterMask) Key() *OuterKey {
	k := o.key
	k.Key, k.Sig = slices.Clone(o.key.Key), slices.Clone(o.key.Sig)
	return &k
}

// Apply adds the child's outer mask R_i to ps, the partial sum its
// sub-cohort round p relayed. cohorts are the round's sub-cohorts (from
// the parent's plan); keys are the children's signed outer keys; delegate
// returns the delegate key the child's own copy of the parent's
// federation lists for a cluster. Apply refuses (SC6020), leaving ps
// unchanged, a set of keys that lacks a sub-cohort's, holds one of no
// sub-cohort or a second one, one not signed by its cluster's delegate,
// or one in this child's place that is not its own. With one sub-cohort
// R_i = 0 and keys are not needed. The private key is forgotten either way.
func (o *OuterMask) Apply(p Params, ps *PartialSum, cohorts []SubCohort, keys []OuterKey, delegate func(cluster string) (ed25519.PublicKey, bool)) error {
	priv := o.priv
	o.priv = nil
	if priv == nil {
		return diag.New(diag.SecAggOutOfOrder, o.subject(), "the outer mask was already applied").WithHelp("draw a new OuterMask for each round")
	}
	r, err := newRound(p)
	if err != nil {
		return err
	}
	refuse := func(format string, args ...any) error {
		return diag.New(diag.SecAggOuterKeys, o.subject(), format, args...).
			WithHelp("the sub-cohort is not forwarded; the parent runs the round again. Check the parent's plan and that this child's parent_federation lists every child cluster with its delegate key")
	}
	switch {
	case ps == nil || ps.Round != o.key.Round || r.id != o.key.Round:
		return refuse("the partial sum or params are not of sub-cohort %q", o.key.Round)
	case len(ps.Masked) != r.lay.size():
		return diag.New(diag.SecAggWrongLength, o.subject(), "masked sum of %d bytes, want %d", len(ps.Masked), r.lay.size()).WithHelp("the partial sum is not of this round")
	}
	byRound, byCluster := map[string]string{}, map[string]bool{}
	for _, c := range cohorts {
		if byRound[c.Round] != "" || byCluster[c.Cluster] || !validID(c.Cluster) {
			return refuse("the plan lists sub-cohort %q or cluster %q twice (or an empty name)", c.Round, c.Cluster)
		}
		byRound[c.Round], byCluster[c.Cluster] = c.Cluster, true
	}
	if byRound[o.key.Round] != o.key.Cluster {
		return refuse("the plan does not give sub-cohort %q to cluster %q", o.key.Round, o.key.Cluster)
	}
	if len(cohorts) == 1 {
		if p.Sites != 0 && p.Sites != r.n {
			return refuse("the plan lists one sub-cohort, but its params are laid out for %d sites, not its %d", p.Sites, r.n)
		}
		return nil // the parent's total is this sum anyway
	}
	if p.Sites <= r.n {
		return refuse("the plan lists %d sub-cohorts, but the params are laid out for %d sites, this sub-cohort's own", len(cohorts), cmp.Or(p.Sites, r.n))
	}
	peers := map[string]*OuterKey{}
	for i := range keys {
		k := &keys[i]
		if err := k.validate(); err != nil {
			return refuse("a malformed key: %v", err)
		}
		cl, ok := byRound[k.Round]
		switch {
		case k.Parent != o.key.Parent:
			return refuse("the key of %q is for round %q", k.Cluster, k.Parent)
		case !ok || cl != k.Cluster:
			return refuse("a key of cluster %q for %q, which is not a sub-cohort it serves in this round", k.Cluster, k.Round)
		case peers[k.Cluster] != nil:
			return refuse("two keys of cluster %q", k.Cluster)
		}
		if k.Cluster == o.key.Cluster {
			if subtle.ConstantTimeCompare(k.Key, o.key.Key) != 1 || subtle.ConstantTimeCompare(k.Sig, o.key.Sig) != 1 {
				return refuse("a key in this child's place (%q) that is not its own", k.Cluster)
			}
			peers[k.Cluster] = k
			continue
		}
		pub, ok := delegate(k.Cluster)
		if !ok || len(pub) != ed25519.PublicKeySize {
			return refuse("cluster %q has no delegate key in this child's copy of the parent federation", k.Cluster)
		}
		if !k.Verify(pub) {
			return refuse("the key of cluster %q is not signed by its delegate key", k.Cluster)
		}
		peers[k.Cluster] = k
	}
	for _, c := range cohorts {
		if c.Cluster != o.key.Cluster && peers[c.Cluster] == nil {
			return refuse("no key from cluster %q (sub-cohort %q)", c.Cluster, c.Round)
		}
	}
	// The salt binds every s_ij to the parent round and to the plan's
	// sub-cohorts: children shown different plans do not cancel.
	sorted := slices.Clone(cohorts)
	slices.SortFunc(sorted, func(a, b SubCohort) int { return strings.Compare(a.Cluster, b.Cluster) })
	salt := sha256.Sum256(mustEncode([]any{labelOuterSalt, o.key.Parent, sorted}))
	var masks []mask
	defer func() {
		for _, m := range masks {
			clear(m.key)
		}
	}()
	for _, c := range sorted {
		if c.Cluster == o.key.Cluster {
			continue
		}
		shared, err := agree(priv, peers[c.Cluster].Key)
		if err != nil {
			return refuse("the key of cluster %q is not a usable X25519 key", c.Cluster)
		}
		lo, hi := o.key.Cluster, c.Cluster
		if hi < lo {
			lo, hi = hi, lo
		}
		masks = append(masks, mask{deriveKey(shared, salt[:], labelOuterMask, lo, hi), pairSign(o.key.Cluster, c.Cluster)})
		clear(shared)
	}
	applyMasks(r.prg, ps.Masked, r.lay, masks, nil)
	return nil
}

func (o *OuterMask) subject() string {
	return fmt.Sprintf("hierarchical secure aggregation round %q, outer mask of %q", o.key.Parent, o.key.Cluster)
}
