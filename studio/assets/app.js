// Scellis Studio: draws the picture the node pushes over server-sent
// events. No library, no request to any other host.
"use strict";
(function () {
  const shownAt = new Map(); // "job/shard" -> when this browser first drew the cell (ms)
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      // Through the CSSOM: the page's CSP forbids style attributes.
      else if (k === "style") for (const d of v.split(";")) { const i = d.indexOf(":"); if (i > 0) e.style.setProperty(d.slice(0, i).trim(), d.slice(i + 1).trim()); }
      else e.setAttribute(k, v);
    }
    for (const k of kids.flat()) {
      if (k === undefined || k === null) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }
  const svgNS = "http://www.w3.org/2000/svg";
  function sv(tag, attrs) {
    const e = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  const fmt = (v, d = 4) => (v === undefined || v === null ? "-" : Number(v).toPrecision(d));
  const short = (ref) => (ref || "").replace("sha256:", "").slice(0, 12);
  const when = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "-");

  // Blue (low) to red (high), through a light middle: readable either way.
  function colour(t) {
    const a = [59, 76, 192], m = [221, 221, 221], b = [180, 4, 38];
    const [p, q, s] = t < 0.5 ? [a, m, t * 2] : [m, b, (t - 0.5) * 2];
    return "rgb(" + p.map((x, i) => Math.round(x + (q[i] - x) * s)).join(",") + ")";
  }

  function heatmap(job) {
    const g = job.grid;
    const byPos = new Map(g.cells.map((c) => [c.x + "," + c.y, c]));
    const now = Date.now();
    const rows = [el("tr", {}, el("th", {}, g.y_name + " \\ " + g.x_name), g.x.map((x) => el("th", {}, x)))];
    g.y.forEach((y, yi) => {
      const tds = g.x.map((_, xi) => {
        const c = byPos.get(xi + "," + yi);
        if (!c) return el("td", { class: "cell" });
        const filled = c.value !== undefined && c.value !== null;
        const key = job.id + "/" + c.shard;
        if (filled && !shownAt.has(key)) shownAt.set(key, now);
        const t = g.hi > g.lo ? (c.value - g.lo) / (g.hi - g.lo) : 1;
        return el("td", {
          class: "cell " + c.state + (filled ? " filled" : "") + (c.shard === g.best ? " best" : ""),
          "data-shard": c.shard, "data-decided-at": c.decided_at || null, "data-shown-at": filled ? shownAt.get(key) : null,
          style: filled ? "background:" + colour(t) + ";color:" + (t > 0.3 && t < 0.7 ? "#000" : "#fff") : null,
          title: g.metric + " " + (filled ? c.value : "(pending)"),
        }, filled ? fmt(c.value, 3) : c.state === "verified" ? "✓" : "");
      });
      rows.push(el("tr", {}, el("th", {}, y), tds));
    });
    const best = g.cells.find((c) => c.shard === g.best);
    return el("div", {},
      el("h3", {}, "Heatmap: " + (g.metric || "value") + " (" + g.goal + " is best)"),
      el("table", { class: "heat", "data-job": job.id }, rows),
      el("p", { class: "mute best-cell" }, best ? "best: shard " + best.shard + ", " + g.x_name + " " + g.x[best.x] + ", " + g.y_name + " " + g.y[best.y] + " → " + fmt(best.value) : "no cell yet"),
      job.hidden ? el("p", { class: "note" }, "Values hidden: this open-pool job's results are for its submitter and operators.") : null);
  }

  function strip(job) {
    return el("div", { class: "strip" }, job.shards.map((s) =>
      el("span", { class: s.s + (s.r ? " replaced" : ""), title: "shard " + s.i + ": " + s.s + (s.r ? " (a report was outvoted)" : "") })));
  }

  function jobCard(job) {
    const c = job.counts;
    return el("div", { class: "job", "data-job": job.id, "data-state": job.state },
      el("h3", {}, job.name + " ", el("code", {}, short(job.id)), " — " + job.state),
      el("div", {}, c.verified + "/" + c.total + " verified · " + c.leased + " leased · " + c.pending + " pending · " + c.unverified + " flagged",
        el("div", { class: "bar" }, el("i", { style: "width:" + (100 * (c.verified + c.unverified) / Math.max(1, c.total)) + "%" }))),
      strip(job),
      job.grid ? heatmap(job) : null);
  }

  // chart draws series of [x, y] points on one SVG; each point is a
  // circle with data-series, so a test can count them.
  function chart(series, xs) {
    const W = 520, H = 200, P = 34;
    const all = series.flatMap((s) => s.pts.map((p) => p[1]));
    const svg = sv("svg", { class: "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    if (!all.length) return svg;
    let lo = Math.min(...all), hi = Math.max(...all);
    if (hi - lo < 1e-9) { lo -= 0.5; hi += 0.5; }
    const xmax = Math.max(1, xs - 1);
    const X = (x) => P + (W - 2 * P) * x / xmax, Y = (y) => H - P + (P * 2 - H) * (y - lo) / (hi - lo);
    svg.append(sv("line", { x1: P, y1: H - P, x2: W - P, y2: H - P, stroke: "#ccc" }));
    for (const v of [lo, hi]) {
      const t = sv("text", { x: 2, y: Y(v) + 3 }); t.textContent = fmt(v, 3); svg.append(t);
    }
    const lx = sv("text", { x: W / 2, y: H - 6 }); lx.textContent = "round"; svg.append(lx);
    for (const s of series) {
      if (!s.pts.length) continue;
      svg.append(sv("polyline", { fill: "none", stroke: s.colour, "stroke-width": 2, points: s.pts.map((p) => X(p[0]) + "," + Y(p[1])).join(" ") }));
      for (const p of s.pts) svg.append(sv("circle", { class: "pt", "data-series": s.name, cx: X(p[0]), cy: Y(p[1]), r: 3, fill: s.colour }));
    }
    return svg;
  }

  function runCard(run) {
    const pts = (k) => run.done.filter((r) => r[k] !== undefined && r[k] !== null).map((r) => [r.round, r[k]]);
    const series = [
      { name: "train_loss", colour: "#1f5fbf", pts: pts("train_loss") },
      { name: "eval_loss", colour: "#c62828", pts: pts("eval_loss") },
    ];
    const acc = [{ name: "eval_accuracy", colour: "#2e7d32", pts: pts("eval_accuracy") }];
    const n = Math.max(run.rounds, run.done.length + 1);
    // Only charts with points are drawn; with none, the node's curve_note
    // says why (under DP a training round releases no loss) in their place.
    const charts = [series, acc].filter((ss) => ss.some((s) => s.pts.length > 0)).map((ss) => chart(ss, n));
    const drawn = charts.length > 0;
    const rows = run.done.map((r) => el("tr", { "data-round": r.round },
      el("td", { class: "n" }, r.round), el("td", {}, r.step || "train"), el("td", {}, r.participants.join(", ")),
      el("td", {}, (r.dropped || []).join(", ")),
      el("td", {}, Object.entries(r.declined || {}).map(([s, why]) => s + ": " + why).join("; ")),
      el("td", { class: "n" }, fmt(r.train_loss)), el("td", { class: "n" }, fmt(r.eval_loss)), el("td", { class: "n" }, fmt(r.eval_accuracy)),
      el("td", {}, Object.entries(r.epsilon || {}).map(([s, e]) => s + " " + fmt(e, 3)).join(", ")),
      el("td", { class: "n" }, r.done_at && r.started_at ? ((r.done_at - r.started_at) / 1000).toFixed(1) + " s" : "-")));
    return el("div", { class: "run", "data-run": run.id, "data-state": run.state, "data-rounds-done": run.done.length },
      el("h3", {}, run.name + " ", el("code", {}, short(run.id)), " — " + run.state + (run.reason ? ": " + run.reason : "") +
        " · " + run.done.length + "/" + run.rounds + " steps · cohort " + run.silos.join(", ")),
      drawn ? el("div", { class: "legend" }, el("span", {}, el("i", { class: "k", style: "background:#1f5fbf" }), "train loss"),
        el("span", {}, el("i", { class: "k", style: "background:#c62828" }), "held-out loss"),
        el("span", {}, el("i", { class: "k", style: "background:#2e7d32" }), "held-out accuracy (right)")) : null,
      drawn ? el("div", { class: "charts" }, charts) : el("p", { class: "no-curve" }, run.curve_note || "no step of the run has completed yet"),
      drawn && run.curve_note ? el("p", { class: "note curve-note" }, run.curve_note) : null,
      run.current ? el("div", {}, "round in progress: ", strip(run.current)) : null,
      el("table", {}, el("tr", {}, ["round", "step", "participants", "dropped", "declined (codes)", "train loss", "held-out loss", "held-out acc", "ε this round", "time"].map((h) => el("th", {}, h))), rows));
  }

  function privacy(p) {
    const rows = (p.privacy || []).map((r) => el("tr", { "data-silo": r.silo, "data-dataset": r.dataset },
      el("td", {}, r.silo), el("td", {}, r.dataset), el("td", { class: "n" }, r.round),
      el("td", { class: "n round" }, fmt(r.round_epsilon)), el("td", { class: "n cum", "data-v": r.cumulative_epsilon }, fmt(r.cumulative_epsilon)),
      el("td", { class: "n" }, r.delta), el("td", { class: "n" }, fmt(r.budget_epsilon)), el("td", { class: "n rem" }, fmt(r.remaining_epsilon)),
      el("td", {}, el("div", { class: "bar" }, el("i", { style: "width:" + Math.min(100, 100 * r.cumulative_epsilon / Math.max(1e-9, r.budget_epsilon)) + "%" }))),
      el("td", { class: "n" }, r.charges), el("td", { class: "n" }, r.declined), el("td", {}, r.verified ? "signatures ✓" : "UNVERIFIED")));
    const out = [rows.length ? el("table", {}, el("tr", {}, ["silo", "dataset", "round", "ε this round", "ε cumulative", "δ", "ε budget", "ε remaining", "spent", "charges", "declined", "records"].map((h) => el("th", {}, h))), rows) : el("p", { class: "empty" }, "No charges yet.")];
    if (p.ledger && p.ledger.length) {
      out.push(el("h3", {}, "Your ledger (" + p.viewer.member + "), in full"),
        el("table", { class: "ledger" }, el("tr", {}, ["run", "round", "status", "ε", "ε cumulative", "ledger seq", "ledger entry", "ledger head", "refusals", "signature"].map((h) => el("th", {}, h))),
          p.ledger.map((e) => el("tr", { "data-charged": e.ledger_entry ? "1" : null }, el("td", {}, e.run), el("td", { class: "n" }, e.round), el("td", {}, e.status), el("td", { class: "n" }, fmt(e.epsilon)),
            el("td", { class: "n" }, fmt(e.cumulative_epsilon)), el("td", { class: "n" }, e.ledger_seq || "-"), el("td", {}, el("code", {}, short(e.ledger_entry))),
            el("td", {}, el("code", {}, short(e.ledger_head))), el("td", {}, (e.refusals || []).join(", ")), el("td", {}, e.verified ? "✓" : "✗")))));
    }
    return out;
  }

  function receipts(p) {
    const r = p.receipts;
    const contrib = Object.entries(p.contributions || {}).sort((a, b) => b[1] - a[1]);
    return [
      el("p", {}, r.count + " receipts · chain head ", el("code", {}, short(r.head))),
      el("table", {}, el("tr", {}, ["seq", "job", "shard", "peers", "work units", "method", "hash"].map((h) => el("th", {}, h))),
        (r.recent || []).map((x) => el("tr", {}, el("td", { class: "n" }, x.seq), el("td", {}, el("code", {}, x.job)), el("td", { class: "n" }, x.shard),
          el("td", {}, x.peers.join(", ")), el("td", { class: "n" }, x.work_units), el("td", {}, x.method), el("td", {}, el("code", {}, x.hash))))),
      el("h3", {}, "Verified work units per member"),
      el("table", {}, contrib.map(([m, u]) => el("tr", {}, el("td", {}, m), el("td", { class: "n" }, u)))),
    ];
  }

  function cluster(p) {
    const c = p.cluster;
    const kv = [["this node", c.node], ["its state", c.state], ["leader", c.leader || "(none known)"], ["term", c.term],
      ["commit index", c.commit_index], ["applied index", c.applied_index], ["receipt chain", c.chain_seq + " · head " + short(c.chain_head)],
      ["state hash", short(c.state_hash)], ["voters", (c.servers || []).join(", ")], ["picture", "#" + p.version]];
    const nodes = c.nodes || [];
    const heads = new Set(nodes.filter((n) => n.reachable).map((n) => n.chain_seq + "/" + n.chain_head));
    return [el("table", {}, kv.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { "data-k": k }, v)))),
      nodes.length ? el("h3", {}, "Every aggregator" + (heads.size > 1 ? " (chain heads differ: a node is catching up or diverged)" : "")) : null,
      nodes.length ? el("table", { class: "nodes" }, el("tr", {}, ["node", "state", "term", "commit", "applied", "chain", "head"].map((h) => el("th", {}, h))),
        nodes.map((n) => el("tr", { "data-node": n.node }, el("td", {}, n.node), el("td", {}, n.reachable ? n.state : "unreachable"),
          el("td", { class: "n" }, n.term || "-"), el("td", { class: "n" }, n.commit_index || "-"), el("td", { class: "n" }, n.applied_index || "-"),
          el("td", { class: "n" }, n.chain_seq || "-"), el("td", {}, el("code", {}, short(n.chain_head)))))) : null];
  }

  function fill(id, nodes, emptyText) {
    const body = $(id).querySelector(".body");
    const list = [nodes].flat().filter(Boolean);
    body.replaceChildren(...(list.length ? list : [el("p", { class: "empty" }, emptyText)]));
  }

  function draw(p) {
    fill("jobs", (p.jobs || []).slice().reverse().map(jobCard), "No pool jobs yet.");
    fill("runs", (p.runs || []).slice().reverse().map(runCard), "No training runs yet.");
    fill("privacy", privacy(p), "No charges yet.");
    fill("receipts", receipts(p), "");
    fill("cluster", cluster(p), "");
    $("who").textContent = p.viewer.member + " (" + p.viewer.role + ", " + p.viewer.via + ") · node " + p.cluster.node;
    document.body.dataset.version = p.version;
    record(p);
  }

  // What every picture showed, for tests and for debugging from the
  // console: per picture, each sweep's filled cells, each run's loss
  // points and each silo's cumulative ε.
  const studio = (window.scellisStudio = { history: [] });
  function record(p) {
    const h = { v: p.version, at: Date.now(), cells: {}, points: {}, eps: {} };
    for (const j of p.jobs || []) if (j.grid) h.cells[j.id] = j.grid.cells.filter((c) => c.value !== undefined && c.value !== null).length;
    for (const r of p.runs || []) h.points[r.id] = r.done.filter((x) => x.train_loss !== undefined && x.train_loss !== null).length;
    for (const r of p.privacy || []) h.eps[r.silo + "/" + r.dataset] = r.cumulative_epsilon;
    studio.history.push(h);
    if (studio.history.length > 5000) studio.history.shift();
  }

  function connect() {
    const es = new EventSource("/api/events");
    es.addEventListener("picture", (ev) => {
      $("live").className = "on"; $("live").textContent = "live";
      draw(JSON.parse(ev.data));
    });
    es.onerror = () => { $("live").className = "off"; $("live").textContent = "reconnecting…"; };
  }
  connect();
})();
