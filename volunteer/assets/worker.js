// A Web Worker running the shard executor compiled to WebAssembly: the
// page posts it the compiled module once, then shard requests; it answers
// each with the result bytes and hash. The page terminates it to stop at
// once (Stop, a hidden tab, a low battery): a shard's run has no other way
// to be interrupted, and none is needed.
"use strict";
importScripts("wasm_exec.js");

let ready = null;
self.onmessage = async (ev) => {
  const m = ev.data;
  if (m.module) {
    const go = new Go();
    ready = WebAssembly.instantiate(m.module, go.importObject).then((inst) => { go.run(inst); });
    return;
  }
  try {
    await ready;
    const r = await self.scellisRunShard(m.request);
    self.postMessage({id: m.id, result: r.result, hash: r.hash}, [r.result.buffer]);
  } catch (e) {
    self.postMessage({id: m.id, error: String(e)});
  }
};
