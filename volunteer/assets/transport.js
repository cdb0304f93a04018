// The volunteer page's transport: how it talks to the pool. The page
// uses only this interface, so another transport (WebRTC data channels
// for shard inputs and results) can replace shard() and report() without
// touching the controller in app.js. Every method returns a Promise and
// rejects with an Error whose .diag holds the server's diagnostics
// ({code, subject, message, help}) and .status the HTTP status.
//
//   project()                       → {pool, regime, open, jobs, rules}
//   challenge(key)                  → {challenge, difficulty, expires}
//   join({key, challenge, nonce, sig}) → {token, peer, expires}
//   lease(token, max)               → {grants: [{job, shard, shard_id, expiry, tier, …}], peer}
//   shard(token, job, shard)        → Uint8Array (job.ShardRequest, canonical encoding)
//   release(token, shards?)         → leases handed back (all when shards is absent)
//   report(token, {job, shard, result: Uint8Array, sig}, signal) → the coordinator's answer
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

function toBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

window.ScellisTransport = {HTTPSTransport};
