// The volunteer page's transport: how it talks to the pool. The page
// uses only this interface. HTTPSTransport carries everything over the
// volunteer API; DataPlaneTransport (when the node's data-plane module,
// /p2p/browser/dataplane.js, loads) moves a shard's bytes — its bundle
// and content sources in, its result out — with that module instead:
// over a WebRTC data channel to the node when one comes up, else the
// node's /blobs/ over HTTPS, hash-checked either way. Leases, releases
// and reports stay on the volunteer API. Every method returns a Promise
// and rejects with an Error whose .diag holds the server's diagnostics
// ({code, subject, message, help}) and .status the HTTP status.
//
//   project()                       → {pool, regime, open, jobs, rules}
//   challenge(key)                  → {challenge, difficulty, expires}
//   join({key, challenge, nonce, sig}) → {token, peer, expires}
//   lease(token, max)               → {grants: [{job, shard, shard_id, expiry, tier, …}], peer}
//   shard(token, job, shard)        → Uint8Array (job.ShardRequest, canonical encoding)
//   release(token, shards?)         → leases handed back (all when shards is absent)
//   report(token, {job, shard, result: Uint8Array, sig}, signal) → the coordinator's answer
//   close()                         ends the data plane's connection, if any
//   path                            how the last shard's bytes went: "direct" or
//                                   "relayed" (a data channel) or "https"
"use strict";

class HTTPSTransport {
  constructor(base) { this.base = base || ""; }

  async call(method, path, token, body, signal, raw) {
    const headers = {};
    if (token) headers["Authorization"] = "Bearer " + token;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(this.base + path, {method, headers, signal, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body)});
    if (!res.ok) {
      let diags = [];
      try { diags = (await res.json()).diagnostics; } catch (e) { /* not JSON */ }
      const d = Array.isArray(diags) && diags.length ? diags[0] : {code: "HTTP" + res.status, message: res.statusText};
      const err = new Error(d.code + ": " + d.message + (d.help ? " (" + d.help + ")" : ""));
      err.diag = d; err.status = res.status;
      throw err;
    }
    return raw ? new Uint8Array(await res.arrayBuffer()) : res.json();
  }

  project() { return this.call("GET", "/volunteer/v1/project"); }
  challenge(key) { return this.call("POST", "/volunteer/v1/challenge", null, {key}); }
  join(req) { return this.call("POST", "/volunteer/v1/join", null, req); }
  lease(token, max) { return this.call("POST", "/volunteer/v1/lease", token, {max}); }
  shard(token, job, shard) {
    return this.call("GET", "/volunteer/v1/shard?job=" + encodeURIComponent(job) + "&shard=" + shard, token, undefined, undefined, true);
  }
  release(token, shards) { return this.call("POST", "/volunteer/v1/release", token, shards ? {shards} : {}, undefined); }
  report(token, r, signal) {
    return this.call("POST", "/volunteer/v1/results", token,
      {job: r.job, shard: r.shard, result: toBase64(r.result), sig: r.sig}, signal);
  }
}

// DataPlaneTransport is HTTPSTransport with shard() and report() moving
// the bytes over the data plane dp (the module's createDataPlane). The
// shard's request is built in the page's WebAssembly module
// (scellisShardRequest), from the blobs the node names, into the same
// bytes the API's shard endpoint would send.
class DataPlaneTransport extends HTTPSTransport {
  constructor(base, module, options) {
    super(base);
    this.module = module;     // the imported dataplane.js
    this.options = options || {};
    this.dp = null;
    this.token = "";
    this.epoch = 0; // bumped by close(): calls begun before it open nothing
  }

  get path() { return this.dp ? this.dp.path || "" : this.lastPath || ""; }
  get stats() { return this.dp ? this.dp.stats : null; }

  // plane is the session's data plane, made on first use; a new session
  // token gets a new one. A call begun before close() (epoch) gets none:
  // Stop must not be undone by a shard still on its way.
  plane(token, epoch) {
    if (epoch !== this.epoch) throw new DOMException("the data plane was closed", "AbortError");
    if (this.dp && this.token !== token) this.drop();
    if (!this.dp) {
      this.dp = this.module.createDataPlane(Object.assign({}, this.options, {token, base: this.base}));
      this.token = token;
    }
    return this.dp;
  }

  // close ends the connection and every call begun before it.
  close() {
    this.epoch++;
    this.drop();
  }

  drop() {
    if (!this.dp) return;
    this.lastPath = this.dp.path;
    this.dp.close();
    this.dp = null;
  }

  async shard(token, job, shard) {
    const epoch = this.epoch;
    const refs = await this.call("GET", "/volunteer/v1/shard?form=refs&job=" + encodeURIComponent(job) + "&shard=" + shard, token);
    const dp = this.plane(token, epoch);
    const [bundle, ...blobs] = await Promise.all([refs.bundle, ...refs.sources].map((r) => dp.getBlob(r)));
    const sources = {};
    refs.sources.forEach((r, i) => { sources[r] = blobs[i]; });
    const req = scellisShardRequest(bundle, sources, refs.job, refs.shard);
    if (req.error) throw new Error(req.error);
    return req;
  }

  async report(token, r, signal) {
    const ref = await this.plane(token, this.epoch).putBlob(r.result);
    if (signal && signal.aborted) throw new DOMException("stopped", "AbortError");
    return this.call("POST", "/volunteer/v1/results", token,
      {job: r.job, shard: r.shard, result_ref: ref, sig: r.sig}, signal);
  }
}

function toBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

HTTPSTransport.prototype.close = function () {};
Object.defineProperty(HTTPSTransport.prototype, "path", {get() { return "https"; }, configurable: true});

// load returns the data-plane transport, or HTTPSTransport (and why) when
// the node's module cannot be loaded.
async function load(base, options) {
  try {
    const module = await import((base || "") + "/p2p/browser/dataplane.js");
    return {transport: new DataPlaneTransport(base, module, options), why: ""};
  } catch (e) {
    return {transport: new HTTPSTransport(base), why: String(e && e.message || e)};
  }
}

window.ScellisTransport = {HTTPSTransport, DataPlaneTransport, load};
