package receipt

import (
	"crypto/sha256"
	"fmt"
)

// Batch signatures. A worker that reports many results in one request
// signs them with one Ed25519ctx signature instead of one each (issue 29:
// the signature on the worker and its check on every aggregator were a
// fifth of a trivial shard's CPU): it puts the statements' hashes in a
// Merkle tree, signs the root under PurposeResultBatch, and sends with
// each report the one signature and the report's path from its leaf to
// the root. The receipt keeps both (PeerSignature.Path), so it still
// verifies offline on its own: hash the statement the receipt implies,
// fold the path, and check the signature of the root. The other reports
// of the batch are not needed, and the path reveals only hashes of them.
//
// Leaves and inner nodes are hashed under different one-byte prefixes
// (as in RFC 6962), so no inner node passes for a statement's leaf, and a
// path proves only statements the signer put in its tree. The purpose is
// not PurposeResult: a root signature never verifies as a signature of a
// statement, nor the reverse.

// PurposeResultBatch is the Ed25519ctx context of a signature of a batch
// of Statements' Merkle root: the value of identity.PurposeResultBatch.
const PurposeResultBatch = "scellis/result-batch/v1"

// PathStep is the size of one step of a batch path: a side byte (0: the
// sibling is on the left, 1: on the right) and the sibling's SHA-256.
const PathStep = 1 + sha256.Size

// MaxPathSteps bounds a batch path: 2^16 statements in one tree, far
// above any batch a request carries (api.MaxBatch).
const MaxPathSteps = 16

const (
	leafPrefix = 0x00
	nodePrefix = 0x01
)

// StatementLeaf is the leaf hash of s in a batch tree.
func StatementLeaf(s Statement) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte{leafPrefix})
	h.Write(s.Bytes())
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

func node(left, right [sha256.Size]byte) [sha256.Size]byte {
	var b [1 + 2*sha256.Size]byte
	b[0] = nodePrefix
	copy(b[1:], left[:])
	copy(b[1+sha256.Size:], right[:])
	return sha256.Sum256(b[:])
}

// BatchTree builds the Merkle tree of leaves and returns its root and, for
// each leaf, its path to the root. Each level pairs its nodes in order; an
// odd last node moves up unpaired (its path has no step for that level).
// One leaf is its own root, with an empty path.
func BatchTree(leaves [][sha256.Size]byte) (root [sha256.Size]byte, paths [][]byte) {
	if len(leaves) == 0 {
		return root, nil
	}
	paths = make([][]byte, len(leaves))
	// at[i]: leaf i's node index at the current level.
	at := make([]int, len(leaves))
	for i := range at {
		at[i] = i
	}
	level := leaves
	for len(level) > 1 {
		for i, k := range at {
			switch {
			case k%2 == 1:
				paths[i] = appendStep(paths[i], 0, level[k-1])
			case k+1 < len(level):
				paths[i] = appendStep(paths[i], 1, level[k+1])
			}
			at[i] = k / 2
		}
		up := make([][sha256.Size]byte, 0, (len(level)+1)/2)
		for k := 0; k < len(level); k += 2 {
			if k+1 < len(level) {
				up = append(up, node(level[k], level[k+1]))
			} else {
				up = append(up, level[k])
			}
		}
		level = up
	}
	return level[0], paths
}

func appendStep(path []byte, side byte, sibling [sha256.Size]byte) []byte {
	return append(append(path, side), sibling[:]...)
}

// checkPath says what is wrong with path's shape ("" when nothing).
func checkPath(path []byte) string {
	if len(path)%PathStep != 0 || len(path) > MaxPathSteps*PathStep {
		return fmt.Sprintf("a batch path of %d bytes (steps of %d bytes, at most %d)", len(path), PathStep, MaxPathSteps)
	}
	for i := 0; i < len(path); i += PathStep {
		if path[i] > 1 {
			return fmt.Sprintf("a batch path whose step %d has side %d (0 or 1)", i/PathStep, path[i])
		}
	}
	return ""
}

// PathRoot folds path up from leaf and returns the root it leads to; false
// when path is malformed.
func PathRoot(leaf [sha256.Size]byte, path []byte) ([sha256.Size]byte, bool) {
	if checkPath(path) != "" {
		return leaf, false
	}
	cur := leaf
	for i := 0; i < len(path); i += PathStep {
		var sib [sha256.Size]byte
		copy(sib[:], path[i+1:i+PathStep])
		if path[i] == 0 {
			cur = node(sib, cur)
		} else {
			cur = node(cur, sib)
		}
	}
	return cur, true
}

// SignedMessage returns what a signature of s carries, given the batch
// path that came with it: s's own bytes under PurposeResult when path is
// empty (a statement signed alone), else the root path leads to from s's
// leaf under PurposeResultBatch. ok is false for a malformed path.
func SignedMessage(s Statement, path []byte) (purpose string, msg []byte, ok bool) {
	if len(path) == 0 {
		return PurposeResult, s.Bytes(), true
	}
	root, ok := PathRoot(StatementLeaf(s), path)
	if !ok {
		return "", nil, false
	}
	return PurposeResultBatch, root[:], true
}

// VerifyStatementIn reports whether sig, with its batch path (empty for
// a statement signed alone), is key's signature of s.
func VerifyStatementIn(key string, s Statement, sig, path []byte) bool {
	purpose, msg, ok := SignedMessage(s, path)
	return ok && VerifySigned(key, purpose, msg, sig)
}
