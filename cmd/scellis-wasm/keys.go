//go:build js && wasm

package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strconv"
	"syscall/js"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/receipt"
	"github.com/scellis/scellis/volunteer/proof"
)

// The tab's volunteer identity. The seed is the private key: it stays in
// the page (and in the export the volunteer asks for); only the public key
// and signatures leave it.

func bytesOf(v js.Value) []byte {
	b := make([]byte, v.Get("length").Int())
	js.CopyBytesToGo(b, v)
	return b
}

func toJS(b []byte) js.Value {
	out := js.Global().Get("Uint8Array").New(len(b))
	js.CopyBytesToJS(out, b)
	return out
}

func keyText(pub ed25519.PublicKey) string {
	return receipt.KeyPrefix + base64.StdEncoding.EncodeToString(pub)
}

// seedArg reads a 32-byte seed argument.
func seedArg(v js.Value) (ed25519.PrivateKey, error) {
	if v.Type() != js.TypeObject {
		return nil, errors.New("the seed must be a Uint8Array")
	}
	seed := bytesOf(v)
	if len(seed) != ed25519.SeedSize {
		return nil, errors.New("the seed must have 32 bytes")
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// volunteerKey(seed?) → {public, seed, peer}: a fresh key from
// crypto/rand, or the one an exported seed restores.
func volunteerKey(_ js.Value, args []js.Value) any {
	var priv ed25519.PrivateKey
	if len(args) > 0 && args[0].Type() == js.TypeObject {
		p, err := seedArg(args[0])
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
		priv = p
	} else {
		_, p, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
		priv = p
	}
	pub := keyText(priv.Public().(ed25519.PublicKey))
	return map[string]any{"public": pub, "seed": toJS(priv.Seed()), "peer": receipt.VolunteerPeer(pub)}
}

// solveJoin(seed, challenge, bits) → {nonce, sig}: the proof of work and
// the key's signature of the join message. It blocks the calling thread
// for 2^bits hashes on average; the page calls it once per session.
func solveJoin(_ js.Value, args []js.Value) any {
	if len(args) != 3 {
		return map[string]any{"error": "scellisSolveJoin(seed, challenge, bits)"}
	}
	priv, err := seedArg(args[0])
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	challenge, bits := args[1].String(), args[2].Int()
	key := keyText(priv.Public().(ed25519.PublicKey))
	nonce := proof.Solve(challenge, key, bits)
	sig, err := priv.Sign(nil, proof.JoinMessage(challenge, key), &ed25519.Options{Context: proof.PurposeJoin})
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	return map[string]any{"nonce": strconv.FormatUint(nonce, 10), "sig": base64.StdEncoding.EncodeToString(sig)}
}

// signResult(seed, job, shard, result, tier, peer) → base64 signature of
// the result statement, as a native peer signs it (pool.Deliver).
func signResult(_ js.Value, args []js.Value) any {
	if len(args) != 6 {
		return map[string]any{"error": "scellisSignResult(seed, job, shard, result, tier, peer)"}
	}
	priv, err := seedArg(args[0])
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	job, err1 := content.ParseRef(args[1].String())
	res, err2 := content.ParseRef(args[3].String())
	if err := errors.Join(err1, err2); err != nil {
		return map[string]any{"error": err.Error()}
	}
	st := receipt.Statement{Job: job, Shard: args[2].Int(), Result: res, Tier: args[4].String(), Peer: args[5].String()}
	sig, err := priv.Sign(nil, st.Bytes(), &ed25519.Options{Context: receipt.PurposeResult})
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	return map[string]any{"sig": base64.StdEncoding.EncodeToString(sig)}
}
