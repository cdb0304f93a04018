// Scellis data plane for a browser tab (an ES module; served by an
// aggregator node at /p2p/browser/dataplane.js, embedded in the binary).
//
// It moves blobs — shard inputs in, shard results out — between the tab
// and the node that served its page: over a WebRTC data channel when one
// comes up within connectTimeoutMs, else over the node's HTTPS blob
// endpoint (/blobs/). Either way the bytes are hash-checked: a blob is
// handed over only if it hashes to the ref asked for, and a result is
// stored only under the ref its bytes hash to.
//
//   import { createDataPlane } from "/p2p/browser/dataplane.js";
//   const dp = createDataPlane({ token });      // the volunteer session token
//   const bundle = await dp.getBlob("sha256:…"); // Uint8Array
//   const ref = await dp.putBlob(resultBytes);   // "sha256:…"
//   dp.path;  // "direct", "relayed" or "https": how the last blob went
//   dp.close();
//
// The wire protocol is the native data plane's (dataplane/transfer.go):
// one data channel per transfer, labelled by its operation; the tab sends
// a JSON request {"op":"get","ref":…} or {"op":"put","ref":…,"size":n};
// a get's reply {"ok":true,"size":n} is followed by the bytes, a put's
// bytes by the reply {"ok":true}; messages are at most 64 KiB; a refusal
// is {"ok":false,"error":…}. Signalling is one HTTPS request: the offer
// (every ICE candidate gathered) is POSTed to /p2p/browser/offer with
// Authorization: Bearer <token>, and the node's answer comes back in the
// response, so the DTLS fingerprints travel only over TLS to the node.

const CHUNK = 64 * 1024;
const HIGH_WATER = 4 << 20; // send-buffer marks, as natively
const LOW_WATER = 1 << 20;
const MAX_BLOB = 256 << 20; // blob.DefaultMaxSize
const STALL_MS = 30000; // a transfer that makes no progress this long fails
const REF = /^sha256:[0-9a-f]{64}$/;

// hashRef is the content ref of bytes: "sha256:" and the hex SHA-256.
export async function hashRef(bytes) {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  let hex = "";
  for (const b of d) hex += b.toString(16).padStart(2, "0");
  return "sha256:" + hex;
}

// A Refusal is the node saying no (not allowed, not found, too large):
// the other path would say the same, so it is not retried over HTTPS.
export class Refusal extends Error {}

// createDataPlane returns the tab's data plane. Options:
//   token             the volunteer session token (required)
//   base              the node's origin ("" : the page's own)
//   ice               "all" (default), "relay" (TURN only) or "https"
//                     (no data channel at all)
//   connectTimeoutMs  bound on setting up the channel (default 5000)
//   retryAfterMs      after the channel fails, HTTPS only for this long
//                     (default 60000)
//   log               function(string) told of path changes
export function createDataPlane(opts) {
  return new DataPlane(opts || {});
}

class DataPlane {
  constructor({ token, base = "", ice = "all", connectTimeoutMs = 5000, retryAfterMs = 60000, log = () => {} }) {
    if (!token) throw new Error("createDataPlane needs the volunteer session token");
    if (!["all", "relay", "https"].includes(ice)) throw new Error(`ice must be all, relay or https, not ${ice}`);
    this.token = token;
    this.base = base;
    this.ice = ice;
    this.connectTimeoutMs = connectTimeoutMs;
    this.retryAfterMs = retryAfterMs;
    this.log = log;
    this.path = "";
    this.lastError = "";
    this.stats = { direct: 0, relayed: 0, https: 0, fallbacks: 0 };
    this.pc = null; // a Promise of the connection, or of null (no channel)
    this.downUntil = 0;
  }

  // getBlob fetches the blob ref names and returns its bytes (Uint8Array),
  // checked against ref.
  async getBlob(ref) {
    if (typeof ref !== "string" || !REF.test(ref)) throw new Error(`not a blob ref: ${String(ref).slice(0, 80)}`);
    const conn = await this._conn();
    if (conn) {
      try {
        const b = await getOver(conn.pc, ref);
        this._moved(conn.path, b.length);
        return b;
      } catch (e) {
        if (e instanceof Refusal) throw e;
        this._broken(e);
      }
    }
    const r = await this._fetch("/blobs/" + ref, {});
    const b = new Uint8Array(await r.arrayBuffer());
    const got = await hashRef(b);
    if (got !== ref) throw new Error(`the node sent bytes that hash to ${got}, not ${ref}`);
    this._moved("https", b.length);
    return b;
  }

  // putBlob stores bytes (a Uint8Array) on the node and returns their ref
  // once the node has checked and stored them.
  async putBlob(bytes) {
    if (!(bytes instanceof Uint8Array)) throw new Error("putBlob takes a Uint8Array");
    if (bytes.length > MAX_BLOB) throw new Refusal(`a blob of ${bytes.length} bytes exceeds ${MAX_BLOB}`);
    const ref = await hashRef(bytes);
    const conn = await this._conn();
    if (conn) {
      try {
        await putOver(conn.pc, ref, bytes);
        this._moved(conn.path, bytes.length);
        return ref;
      } catch (e) {
        if (e instanceof Refusal) throw e;
        this._broken(e);
      }
    }
    await this._fetch("/blobs/" + ref, { method: "PUT", body: bytes });
    this._moved("https", bytes.length);
    return ref;
  }

  // close ends the data channel connection, if any.
  close() {
    const p = this.pc;
    this.pc = null;
    if (p) p.then((c) => c && c.pc.close());
  }

  _moved(path, n) {
    this.stats[path] += n;
    if (path !== this.path) this.log(`blobs go over ${path === "https" ? "the https fallback" : `a ${path} data channel`}` + (path === "https" && this.lastError ? ` (data channel: ${this.lastError})` : ""));
    this.path = path;
  }

  // _broken drops a channel that failed a transfer: HTTPS for a while.
  _broken(e) {
    this.lastError = String(e && e.message ? e.message : e);
    this.stats.fallbacks++;
    this.close();
    this.downUntil = Date.now() + this.retryAfterMs;
  }

  // _conn is the live connection, set up on first use and shared by
  // concurrent transfers; null when there is none to use.
  async _conn() {
    if (this.ice === "https" || typeof RTCPeerConnection === "undefined") {
      if (!this.lastError) this.lastError = this.ice === "https" ? "disabled (ice: https)" : "this browser has no RTCPeerConnection";
      return null;
    }
    if (this.pc) {
      const c = await this.pc;
      if (c && c.pc.connectionState === "connected") return c;
      if (c) this._broken(new Error(`the connection is ${c.pc.connectionState}`));
      this.pc = null;
    }
    if (Date.now() < this.downUntil) return null;
    this.pc = this._connect().catch((e) => {
      this.lastError = String(e && e.message ? e.message : e);
      this.stats.fallbacks++;
      this.downUntil = Date.now() + this.retryAfterMs;
      return null;
    });
    return this.pc;
  }

  async _connect() {
    const servers = await (await this._fetch("/p2p/browser/ice", {})).json();
    const pc = new RTCPeerConnection({ iceServers: servers, iceTransportPolicy: this.ice === "relay" ? "relay" : "all" });
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no data channel within ${this.connectTimeoutMs} ms`)), this.connectTimeoutMs);
    });
    try {
      await Promise.race([this._signal(pc), timeout]);
    } catch (e) {
      pc.close();
      throw e;
    } finally {
      clearTimeout(timer);
    }
    return { pc, path: await selectedPath(pc) };
  }

  // _signal offers, takes the answer and waits for the SCTP association
  // (the control channel opening).
  async _signal(pc) {
    const ctl = pc.createDataChannel("ctl");
    const opened = new Promise((resolve, reject) => {
      ctl.onopen = resolve;
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed" || pc.connectionState === "closed") reject(new Error(`ICE ${pc.connectionState}: no working candidate pair`));
      };
    });
    await pc.setLocalDescription(await pc.createOffer());
    if (pc.iceGatheringState !== "complete") {
      await new Promise((resolve) => {
        pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve());
      });
    }
    const r = await this._fetch("/p2p/browser/offer", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sdp: pc.localDescription.sdp }),
    });
    const { sdp } = await r.json();
    await pc.setRemoteDescription({ type: "answer", sdp });
    await opened;
  }

  // _fetch makes an authenticated request to the node; a refusal throws
  // with the node's diagnostic.
  async _fetch(path, init) {
    const headers = Object.assign({}, init.headers, { Authorization: "Bearer " + this.token });
    const r = await fetch(this.base + path, Object.assign({}, init, { headers, cache: "no-store" }));
    if (r.ok) return r;
    let msg = `${r.status} ${r.statusText}`;
    try {
      const body = await r.text();
      const d = JSON.parse(body);
      const first = Array.isArray(d) ? d[0] : d.diagnostics ? d.diagnostics[0] : d;
      msg = first && first.code ? `${first.code}: ${first.message}` : body.slice(0, 300);
    } catch (_) {}
    throw new Refusal(`${path.split("/").slice(0, 3).join("/")}: ${msg}`);
  }
}

// selectedPath is "relayed" when the pair ICE chose goes through TURN.
async function selectedPath(pc) {
  try {
    const stats = await pc.getStats();
    for (const s of stats.values()) {
      if (s.type === "transport" && s.selectedCandidatePairId) {
        const pair = stats.get(s.selectedCandidatePairId);
        const local = pair && stats.get(pair.localCandidateId);
        const remote = pair && stats.get(pair.remoteCandidateId);
        if ((local && local.candidateType === "relay") || (remote && remote.candidateType === "relay")) return "relayed";
      }
    }
  } catch (_) {}
  return "direct";
}

// openChannel opens one transfer's data channel and queues its messages.
function openChannel(pc, label) {
  const dc = pc.createDataChannel(label);
  dc.binaryType = "arraybuffer";
  dc.bufferedAmountLowThreshold = LOW_WATER;
  const queue = [];
  let waiter = null;
  let ended = null;
  const wake = () => {
    if (waiter) {
      const w = waiter;
      waiter = null;
      w();
    }
  };
  dc.onmessage = (ev) => {
    queue.push(typeof ev.data === "string" ? new TextEncoder().encode(ev.data).buffer : ev.data);
    wake();
  };
  dc.onclose = () => {
    ended = ended || new Error(`the ${label} channel closed`);
    wake();
  };
  dc.onerror = (ev) => {
    ended = new Error(`the ${label} channel failed: ${ev.error ? ev.error.message : "error"}`);
    wake();
  };
  // next is the channel's next message (an ArrayBuffer).
  const next = async () => {
    for (;;) {
      if (queue.length) return queue.shift();
      if (ended) throw ended;
      let timer;
      await new Promise((resolve) => {
        waiter = resolve;
        timer = setTimeout(() => {
          ended = ended || new Error(`the node sent nothing for ${STALL_MS} ms`);
          resolve();
        }, STALL_MS);
      });
      clearTimeout(timer);
    }
  };
  // room waits until the send buffer is below the high-water mark.
  const room = () =>
    dc.bufferedAmount <= HIGH_WATER
      ? Promise.resolve()
      : new Promise((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`the node read nothing for ${STALL_MS} ms`)), STALL_MS);
          dc.onbufferedamountlow = () => {
            clearTimeout(timer);
            resolve();
          };
        });
  const opened = new Promise((resolve, reject) => {
    dc.onopen = resolve;
    const was = dc.onclose;
    dc.onclose = () => {
      was();
      reject(new Error(`the ${label} channel closed before it opened`));
    };
  });
  return opened.then(() => ({ dc, next, room }));
}

function reply(buf) {
  const r = JSON.parse(new TextDecoder().decode(buf));
  if (!r.ok) throw new Refusal(`refused: ${r.error}`);
  return r;
}

async function getOver(pc, ref) {
  const { dc, next } = await openChannel(pc, "get");
  try {
    dc.send(JSON.stringify({ op: "get", ref }));
    const r = reply(await next());
    if (!(r.size >= 0 && r.size <= MAX_BLOB)) throw new Error(`the node announced ${r.size} bytes`);
    const out = new Uint8Array(r.size);
    let got = 0;
    while (got < r.size) {
      const m = new Uint8Array(await next());
      if (got + m.length > r.size) throw new Error(`the node sent more than the ${r.size} bytes announced`);
      out.set(m, got);
      got += m.length;
    }
    const h = await hashRef(out);
    if (h !== ref) throw new Error(`the node sent bytes that hash to ${h}, not ${ref}`);
    return out;
  } finally {
    dc.close();
  }
}

async function putOver(pc, ref, bytes) {
  const { dc, next, room } = await openChannel(pc, "put");
  try {
    dc.send(JSON.stringify({ op: "put", ref, size: bytes.length }));
    for (let off = 0; off < bytes.length; off += CHUNK) {
      await room();
      dc.send(bytes.subarray(off, off + CHUNK));
    }
    reply(await next());
  } finally {
    dc.close();
  }
}
