package receipt_test

import (
	"bytes"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/receipt"
)

// A receipt whose peers signed their reports verifies against their keys;
// a missing, swapped, forged or re-keyed signature fails with SC7306, and a
// signature reordered so it no longer follows Peers is malformed.
func TestReceiptSignatures(t *testing.T) {
	if receipt.PurposeResult != string(identity.PurposeResult) || receipt.PurposeResultBatch != string(identity.PurposeResultBatch) || receipt.PurposeCite != string(identity.PurposeCite) || receipt.KeyPrefix != identity.PublicKeyPrefix {
		t.Fatal("receipt's purpose or key prefix drifted from identity's")
	}
	ids := map[string]*identity.Identity{}
	for i, p := range []string{"w1", "w2", "w3"} {
		ids[p] = identity.NewFromSeed([32]byte{byte(i + 1)})
	}
	keyOf := func(p string) (string, bool) {
		id, ok := ids[p]
		if !ok {
			return "", false
		}
		return id.Public().String(), true
	}
	job, result := content.Hash([]byte("job")), content.Hash([]byte("result"))
	sign := func(p string, res content.Ref) receipt.PeerSignature {
		st := receipt.Statement{Job: job, Shard: 3, Result: res, Tier: receipt.TierReplayable, Peer: p}
		return receipt.PeerSignature{Peer: p, Result: res, Key: ids[p].Public().String(), Sig: identity.Sign(ids[p], identity.PurposeResult, st.Bytes())}
	}
	mint := func(mut func(*receipt.Receipt)) receipt.Receipt {
		r := receipt.Receipt{Job: job, Shard: content.Hash([]byte("s3")), ShardIndex: 3, Result: result, Peers: []string{"w2", "w1"},
			Method: "quorum-2-exact", PriceBasis: "flat", Tier: receipt.TierReplayable,
			Signatures: []receipt.PeerSignature{sign("w2", result), sign("w1", result)}}
		if mut != nil {
			mut(&r)
		}
		var c receipt.Chain
		return c.Next(r)
	}
	good := mint(nil)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := good.VerifySignatures(keyOf); err != nil {
		t.Fatalf("signed receipt: %v", err)
	}
	b, err := good.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := receipt.Unmarshal(b); err != nil {
		t.Fatal(err)
	} else if b2, _ := again.Marshal(); !bytes.Equal(b, b2) {
		t.Fatal("round trip not exact")
	}
	cases := map[string]func(*receipt.Receipt){
		"missing":      func(r *receipt.Receipt) { r.Signatures, r.Tier = nil, "" },
		"forged":       func(r *receipt.Receipt) { r.Signatures[1].Sig[0] ^= 1 },
		"other result": func(r *receipt.Receipt) { r.Signatures[0] = sign("w2", content.Hash([]byte("lie"))) },
		"other tier":   func(r *receipt.Receipt) { r.Tier = receipt.TierConvergent },
		"other key": func(r *receipt.Receipt) {
			r.Signatures[0].Key = ids["w3"].Public().String()
			st := receipt.Statement{Job: job, Shard: 3, Result: result, Tier: receipt.TierReplayable, Peer: "w2"}
			r.Signatures[0].Sig = identity.Sign(ids["w3"], identity.PurposeResult, st.Bytes())
		},
		"stranger": func(r *receipt.Receipt) {
			r.Peers = append(r.Peers, "w9")
			r.Signatures = append(r.Signatures, receipt.PeerSignature{Peer: "w9", Result: result, Key: ids["w3"].Public().String(), Sig: make([]byte, 64)})
		},
	}
	for name, mut := range cases {
		r := mint(mut)
		if err := r.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		err := r.VerifySignatures(keyOf)
		if d, ok := diag.As(err); !ok || d[0].Code != diag.ReceiptUnsigned {
			t.Errorf("%s: got %v, want SC7306", name, err)
		}
	}
	bad := mint(func(r *receipt.Receipt) { r.Signatures = r.Signatures[:1] })
	if d, ok := diag.As(bad.Validate()); !ok || d[0].Code != diag.ReceiptMalformed {
		t.Errorf("one signature for two peers: %v, want SC7014", bad.Validate())
	}
}

// A batch of statements signed once (receipt/batch.go): every receipt
// carrying the batch's signature and its own path verifies on its own;
// a receipt whose result, shard, peer, path or signature was changed, or
// whose path was cut, or whose root signature is passed off as a plain
// statement signature (and the reverse), fails with SC7306; a path of a
// bad shape is malformed.
func TestReceiptBatchSignatures(t *testing.T) {
	id := identity.NewFromSeed([32]byte{7})
	other := identity.NewFromSeed([32]byte{8})
	keyOf := func(p string) (string, bool) {
		switch p {
		case "w1":
			return id.Public().String(), true
		case "w2":
			return other.Public().String(), true
		}
		return "", false
	}
	job := content.Hash([]byte("job"))
	result := func(i int) content.Ref { return content.Hash([]byte{byte(i), 'r'}) }
	for _, n := range []int{2, 3, 5, 8, 13} {
		leaves := make([][32]byte, n)
		for i := range leaves {
			leaves[i] = receipt.StatementLeaf(receipt.Statement{Job: job, Shard: i, Result: result(i), Tier: receipt.TierReplayable, Peer: "w1"})
		}
		root, paths := receipt.BatchTree(leaves)
		sig := identity.Sign(id, identity.PurposeResultBatch, root[:])
		mint := func(i int, mut func(*receipt.Receipt)) receipt.Receipt {
			r := receipt.Receipt{Job: job, Shard: content.Hash([]byte{byte(i)}), ShardIndex: i, Result: result(i), Peers: []string{"w1"},
				Method: "quorum-1-exact", PriceBasis: "flat", Tier: receipt.TierReplayable,
				Signatures: []receipt.PeerSignature{{Peer: "w1", Result: result(i), Key: id.Public().String(), Sig: bytes.Clone(sig), Path: bytes.Clone(paths[i])}}}
			if mut != nil {
				mut(&r)
			}
			var c receipt.Chain
			return c.Next(r)
		}
		for i := range n {
			good := mint(i, nil)
			if err := good.Validate(); err != nil {
				t.Fatalf("n=%d leaf %d: %v", n, i, err)
			}
			if err := good.VerifySignatures(keyOf); err != nil {
				t.Fatalf("n=%d leaf %d: %v", n, i, err)
			}
			b, err := good.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if again, err := receipt.Unmarshal(b); err != nil || again.VerifySignatures(keyOf) != nil {
				t.Fatalf("n=%d leaf %d: round trip: %v", n, i, err)
			}
		}
		j := (n - 1) / 2
		cases := map[string]func(*receipt.Receipt){
			"other result": func(r *receipt.Receipt) {
				r.Result = result(99)
				r.Signatures[0].Result = result(99)
			},
			"a sibling's result": func(r *receipt.Receipt) {
				r.Result = result(j + 1)
				r.Signatures[0].Result = result(j + 1)
			},
			"other shard":  func(r *receipt.Receipt) { r.ShardIndex++ },
			"other tier":   func(r *receipt.Receipt) { r.Tier = receipt.TierConvergent },
			"other peer":   func(r *receipt.Receipt) { r.Peers[0], r.Signatures[0].Peer = "w2", "w2" },
			"forged":       func(r *receipt.Receipt) { r.Signatures[0].Sig[5] ^= 1 },
			"path edited":  func(r *receipt.Receipt) { r.Signatures[0].Path[7] ^= 1 },
			"side flipped": func(r *receipt.Receipt) { r.Signatures[0].Path[0] ^= 1 },
			"path cut": func(r *receipt.Receipt) {
				r.Signatures[0].Path = r.Signatures[0].Path[:len(r.Signatures[0].Path)-receipt.PathStep]
			},
			"path dropped": func(r *receipt.Receipt) { r.Signatures[0].Path = nil },
			"root signed as a statement": func(r *receipt.Receipt) {
				r.Signatures[0].Sig = identity.Sign(id, identity.PurposeResult, root[:])
			},
			"statement signature with a path": func(r *receipt.Receipt) {
				st := receipt.Statement{Job: job, Shard: j, Result: result(j), Tier: receipt.TierReplayable, Peer: "w1"}
				r.Signatures[0].Sig = identity.Sign(id, identity.PurposeResult, st.Bytes())
			},
		}
		for name, mut := range cases {
			if name == "path cut" && len(paths[j]) == receipt.PathStep {
				mut = func(r *receipt.Receipt) { r.Signatures[0].Path = r.Signatures[0].Path[:0] }
			}
			r := mint(j, mut)
			if err := r.Validate(); err != nil {
				t.Fatalf("n=%d %s: %v", n, name, err)
			}
			err := r.VerifySignatures(keyOf)
			if d, ok := diag.As(err); !ok || d[0].Code != diag.ReceiptUnsigned {
				t.Errorf("n=%d %s: got %v, want SC7306", n, name, err)
			}
		}
		for name, path := range map[string][]byte{"ragged": make([]byte, receipt.PathStep+1), "bad side": append([]byte{2}, make([]byte, receipt.PathStep-1)...)} {
			r := mint(j, func(r *receipt.Receipt) { r.Signatures[0].Path = path })
			if d, ok := diag.As(r.Validate()); !ok || d[0].Code != diag.ReceiptMalformed {
				t.Errorf("n=%d %s path: %v, want SC7014", n, name, r.Validate())
			}
		}
	}
}
