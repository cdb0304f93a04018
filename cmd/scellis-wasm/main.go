//go:build js && wasm

// Command scellis-wasm is the shard executor compiled to WebAssembly for a
// browser tab: the same catalog, Starlark sandbox, native modules and
// canonical encoding as a native worker, so a shard run in a tab gives the
// same result bytes as on a native peer and exact-match verification can
// pair the two.
//
// Build it with
//
//	GOOS=js GOARCH=wasm go build -o scellis.wasm ./cmd/scellis-wasm
//
// and load it with Go's $(go env GOROOT)/lib/wasm/wasm_exec.js. It defines
// one function, scellisRunShard(request), where request is a
// job.ShardRequest in canonical encoding (a Uint8Array: the job's bundle,
// its content sources, the job ID and the shard index). It returns a
// Promise of {result: Uint8Array, hash: "sha256:…"}, the shard's canonical
// result bytes and their hash, and rejects with the error's text.
//
// scellisShardRequest(bundle, sources, job, shard) builds that request
// from its parts — the bundle's bytes, an object of content sources by
// ref, the job ID and the shard index — as the volunteer API's shard
// endpoint encodes it, so a tab that fetched the blobs over its data
// plane runs the very request the node would have sent. It returns the
// Uint8Array, or {error}.
//
// For the volunteer page (package volunteer) it also defines the tab's
// identity functions, so the page does no crypto in JavaScript:
// scellisVolunteerKey(seed?) makes (or restores) an Ed25519 key from
// crypto/rand and returns {public, seed, peer}; scellisSolveJoin(seed,
// challenge, bits) solves the join endpoint's proof of work and signs the
// join message, returning {nonce, sig}; scellisSignResult(seed, job,
// shard, result, tier, peer) signs a result statement (the signature the
// coordinator checks, SC7305).
//
// Content gets nothing from the page: the sandbox has no builtins for
// files, network, clocks or the environment, and this program adds none
// (it imports no net, os/exec or syscall/js beyond the one function).
// Jobs with input tables are refused for now: a tab has no folder to hold
// them.
package main

import (
	"context"

	"syscall/js"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/job"
)

func main() {
	js.Global().Set("scellisRunShard", js.FuncOf(runShard))
	js.Global().Set("scellisShardRequest", js.FuncOf(shardRequest))
	js.Global().Set("scellisVolunteerKey", js.FuncOf(volunteerKey))
	js.Global().Set("scellisSolveJoin", js.FuncOf(solveJoin))
	js.Global().Set("scellisSignResult", js.FuncOf(signResult))
	select {} // serve calls for the life of the page
}

// runShard answers with a Promise and computes in a goroutine: a
// js.FuncOf callback runs on the page's event loop and must not block it.
func runShard(_ js.Value, args []js.Value) any {
	if len(args) != 1 || args[0].Type() != js.TypeObject {
		return js.Global().Get("Promise").Call("reject", "scellisRunShard takes one Uint8Array")
	}
	raw := make([]byte, args[0].Get("length").Int())
	js.CopyBytesToGo(raw, args[0])
	var resolve, reject js.Value
	executor := js.FuncOf(func(_ js.Value, cb []js.Value) any {
		resolve, reject = cb[0], cb[1]
		return nil
	})
	defer executor.Release()
	promise := js.Global().Get("Promise").New(executor)
	go func() {
		res, err := execute(raw)
		if err != nil {
			reject.Invoke(err.Error())
			return
		}
		out := js.Global().Get("Uint8Array").New(len(res.Bytes))
		js.CopyBytesToJS(out, res.Bytes)
		v := js.Global().Get("Object").New()
		v.Set("result", out)
		v.Set("hash", string(res.Hash))
		resolve.Invoke(v)
	}()
	return promise
}

func execute(raw []byte) (*job.Result, error) {
	var req job.ShardRequest
	if err := content.Decode(raw, &req); err != nil {
		return nil, err
	}
	// A tab has no files: CacheDir stays empty, so a job with inputs is
	// refused rather than written anywhere.
	req.CacheDir = ""
	return req.Execute(context.Background())
}

// shardRequest(bundle, sources, job, shard) → the job.ShardRequest in
// canonical encoding (a Uint8Array), or {error}. The sources' refs and
// the bundle are checked again when the request runs (ShardRequest.Execute
// re-hashes them), so nothing here trusts what the page passes.
func shardRequest(_ js.Value, args []js.Value) any {
	fail := func(msg string) any { return map[string]any{"error": msg} }
	if len(args) != 4 || args[0].Type() != js.TypeObject || args[1].Type() != js.TypeObject ||
		args[2].Type() != js.TypeString || args[3].Type() != js.TypeNumber {
		return fail("scellisShardRequest takes (bundle Uint8Array, sources {ref: Uint8Array}, job, shard)")
	}
	id, err := content.ParseRef(args[2].String())
	if err != nil {
		return fail(err.Error())
	}
	req := job.ShardRequest{Bundle: bytesOf(args[0]), Sources: map[content.Ref][]byte{}, Job: id, Shard: args[3].Int()}
	keys := js.Global().Get("Object").Call("keys", args[1])
	for i := range keys.Length() {
		k := keys.Index(i).String()
		ref, err := content.ParseRef(k)
		if err != nil {
			return fail(err.Error())
		}
		req.Sources[ref] = bytesOf(args[1].Get(k))
	}
	raw, err := content.Encode(req)
	if err != nil {
		return fail(err.Error())
	}
	return toJS(raw)
}
