// The volunteer page's controller: identity (an Ed25519 key made and used
// inside the Go WebAssembly module, never in JavaScript), join, and one
// lease → fetch → compute → sign → report loop per Web Worker. A shard's
// bytes go over the node's data plane (transport.js: a WebRTC data
// channel, else HTTPS) when its module loads, over the volunteer API
// otherwise. Stop, a hidden tab and a battery under the floor all do the
// same at once: terminate the workers (the running shards die with
// them), abort the pending requests, close the data plane and hand every
// lease back.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_PREFIX = "scellis-volunteer-key:v1:";
const IDLE_MS = 1000;   // wait between lease requests when nothing is leasable
const RETRY_MS = 2000;  // wait after a failed request

const V = {
  transport: new window.ScellisTransport.HTTPSTransport(""), // replaced in boot when the data plane loads
  transportNote: "",   // why the data plane is not used, when it is not
  module: null,        // the compiled WebAssembly module, shared with workers
  key: null,           // {public, seed, peer}
  session: null,       // {token, peer, expires}
  state: "stopped",    // stopped | running | paused
  why: "",             // hidden | battery (when paused)
  gen: 0,              // bumped on every stop and pause: older loops end
  workers: [],
  aborts: new Set(),
  held: new Map(),     // "job/shard" → grant
  done: [],            // [{job, shard, hash}]
  leaseRequests: 0,
  maxLeases: 0,        // the node's cap on one tab's leases (project.max_leases)
  errors: [],
  battery: null,
};
window.scellisVolunteer = V;

function b64(bytes) { let s = ""; for (const c of bytes) s += String.fromCharCode(c); return btoa(s); }
function unb64(s) { return Uint8Array.from(atob(s), (c) => c.charCodeAt(0)); }

function show() {
  $("state").textContent = V.state;
  $("why").textContent = V.state === "paused" ? "(" + (V.why === "hidden" ? "the tab is hidden" : "battery below your floor") + ")" : "";
  $("done").textContent = V.done.length;
  $("held").textContent = V.held.size;
  $("peer").textContent = V.key ? V.key.peer : "(no key yet)";
  const path = V.transport.path;
  $("path").textContent = path === "https" ? "HTTPS" : path ? "a " + path + " WebRTC data channel" : "(nothing moved yet)";
  $("path-note").textContent = V.transportNote ? "(the data plane did not load: " + V.transportNote + ")" : "";
  $("start").disabled = V.state !== "stopped";
  $("stop").disabled = V.state === "stopped";
}

function fail(e) {
  V.errors.push(String(e && e.message || e));
  $("error").textContent = V.errors[V.errors.length - 1];
}

async function boot() {
  const go = new Go();
  V.module = await WebAssembly.compileStreaming(fetch("scellis.wasm"));
  const inst = await WebAssembly.instantiate(V.module, go.importObject);
  go.run(inst); // defines the scellis* functions and serves calls
  // window.scellisDataPlaneOptions (connectTimeoutMs, ice) may be set
  // before this script runs, e.g. by a test on a busy machine.
  const t = await window.ScellisTransport.load("", window.scellisDataPlaneOptions);
  V.transport = t.transport;
  V.transportNote = t.why;
  const saved = sessionStorage.getItem("scellis-volunteer-seed");
  setKey(saved ? unb64(saved) : null);
  try {
    const p = await V.transport.project();
    V.maxLeases = p.max_leases || 64; // the node refuses more leases at once (SC7510)
    $("pool").textContent = p.pool || "a Scellis pool";
    $("regime").textContent = p.open ? "An open pool: public inputs only." : "This pool is " + p.regime + ": it takes no browser volunteers.";
    const body = $("jobs").querySelector("tbody");
    for (const j of p.jobs) {
      const tr = document.createElement("tr");
      for (const v of [j.name, j.shards, j.decided]) { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); }
      body.appendChild(tr);
    }
    $("nojobs").hidden = p.jobs.length > 0;
    for (const r of p.rules) { const li = document.createElement("li"); li.textContent = r; $("rules").appendChild(li); }
  } catch (e) { fail(e); }
  $("workers").max = Math.max(1, Math.min(navigator.hardwareConcurrency || 1, V.maxLeases || 64));
  if (navigator.getBattery) {
    try {
      V.battery = await navigator.getBattery();
      V.battery.addEventListener("levelchange", checkPower);
      V.battery.addEventListener("chargingchange", checkPower);
    } catch (e) { V.battery = null; }
  }
  $("battery-note").textContent = V.battery ? "" : "This browser does not tell pages the battery level; the floor cannot apply.";
  document.addEventListener("visibilitychange", checkPower);
  $("start").onclick = start;
  $("stop").onclick = () => { $("confirm").hidden = false; };
  $("confirm-no").onclick = () => { $("confirm").hidden = true; };
  $("confirm-yes").onclick = () => { $("confirm").hidden = true; stop(); };
  $("battery-on").onchange = checkPower;
  $("battery-floor").onchange = checkPower;
  $("export").onclick = () => { $("key-text").value = KEY_PREFIX + b64(V.key.seed); };
  $("import").onclick = importKey;
  V.ready = true;
  show();
}

function setKey(seed) {
  const k = seed ? scellisVolunteerKey(seed) : scellisVolunteerKey();
  if (k.error) throw new Error(k.error);
  V.key = k;
  V.session = null;
  sessionStorage.setItem("scellis-volunteer-seed", b64(k.seed));
}

function importKey() {
  const t = $("key-text").value.trim();
  if (V.state !== "stopped") { fail("stop before importing a key"); return; }
  if (!t.startsWith(KEY_PREFIX)) { fail("an exported key starts with " + KEY_PREFIX); return; }
  try { setKey(unb64(t.slice(KEY_PREFIX.length))); } catch (e) { fail(e); }
  show();
}

// blocked says why work must pause now, or "".
function blocked() {
  if (document.visibilityState === "hidden") return "hidden";
  const b = V.battery;
  if ($("battery-on").checked && b && !b.charging && b.level * 100 < Number($("battery-floor").value)) return "battery";
  return "";
}

function checkPower() {
  if (V.state === "stopped") return;
  const why = blocked();
  if (why && V.state === "running") halt("paused", why);
  else if (!why && V.state === "paused") run();
  show();
}

async function join() {
  const c = await V.transport.challenge(V.key.public);
  const s = scellisSolveJoin(V.key.seed, c.challenge, c.difficulty);
  if (s.error) throw new Error(s.error);
  V.session = await V.transport.join({key: V.key.public, challenge: c.challenge, nonce: s.nonce, sig: s.sig});
}

function start() {
  if (V.state !== "stopped") return;
  V.state = "running";
  const why = blocked();
  if (why) { V.state = "paused"; V.why = why; show(); return; }
  run();
}

function stop() { halt("stopped", ""); show(); }

// halt ends every loop, kills the running shards and hands leases back.
function halt(state, why) {
  V.state = state; V.why = why;
  V.gen++;
  for (const w of V.workers) w.terminate();
  V.workers = [];
  for (const a of V.aborts) a.abort();
  V.aborts.clear();
  V.transport.close();
  const had = V.held.size;
  V.held.clear();
  if (V.session) {
    V.released = V.transport.release(V.session.token).then(() => { V.releases = (V.releases || 0) + 1; }, fail);
  }
  return had;
}

function run() {
  V.state = "running"; V.why = "";
  const gen = ++V.gen;
  const n = Math.max(1, Math.min(Number($("workers").value) || 1, V.maxLeases || 64));
  for (let i = 0; i < n; i++) {
    const w = new Worker("worker.js");
    w.postMessage({module: V.module});
    V.workers.push(w);
    loop(gen, w);
  }
  show();
}

function wait(ms, gen) {
  return new Promise((resolve) => setTimeout(resolve, ms)).then(() => gen === V.gen);
}

function compute(w, request) {
  return new Promise((resolve, reject) => {
    const id = Math.random();
    const on = (ev) => {
      if (ev.data.id !== id) return;
      w.removeEventListener("message", on);
      ev.data.error ? reject(new Error(ev.data.error)) : resolve(ev.data);
    };
    w.addEventListener("message", on);
    w.postMessage({id, request}, [request.buffer]);
  });
}

async function loop(gen, w) {
  while (gen === V.gen) {
    try {
      if (!V.session || V.session.expires < Date.now() + 60000) await join();
      if (gen !== V.gen) return;
      V.leaseRequests++;
      const lr = await V.transport.lease(V.session.token, 1);
      if (gen !== V.gen) return; // halted meanwhile: halt released everything
      if (lr.grants.length === 0) { await wait(IDLE_MS, gen); continue; }
      const g = lr.grants[0];
      const k = g.job + "/" + g.shard;
      V.held.set(k, g); show();
      let req;
      try {
        req = await V.transport.shard(V.session.token, g.job, g.shard);
        if (gen !== V.gen) return;
        const r = await compute(w, req);
        if (gen !== V.gen) return;
        const s = scellisSignResult(V.key.seed, g.job, g.shard, r.hash, g.tier, V.session.peer);
        if (s.error) throw new Error(s.error);
        const abort = new AbortController();
        V.aborts.add(abort);
        try {
          await V.transport.report(V.session.token, {job: g.job, shard: g.shard, result: r.result, sig: s.sig}, abort.signal);
        } finally { V.aborts.delete(abort); }
        V.done.push({job: g.job, shard: g.shard, hash: r.hash, path: V.transport.path});
      } catch (e) {
        if (gen !== V.gen) return;
        fail(e);
        V.transport.release(V.session.token, [{job: g.job, shard: g.shard}]).catch(() => {});
        await wait(RETRY_MS, gen);
      } finally {
        if (gen === V.gen) { V.held.delete(k); show(); }
      }
    } catch (e) {
      if (gen !== V.gen) return;
      if (e.diag && e.diag.code === "SC7505") V.session = null; // join again
      fail(e);
      if (!(await wait(RETRY_MS, gen))) return;
    }
  }
}

boot().catch(fail);
