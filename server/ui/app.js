// The blobref operator console: plain DOM, no framework. Every figure comes from the HTTP API
// (/metrics, /readyz, /v1/...); actions go through the same authenticated routes as any client.
// Blob bytes are never parsed as HTML: previews are <img> elements or textContent.
(function () {
  "use strict";

  const TOKEN_KEY = "blobref.token";
  const POLL_MS = 5000;
  const HISTORY_MS = 15 * 60 * 1000;
  const PAGE = 20;
  // raster images only: an SVG is a document (shown as a hex dump like anything else)
  const IMAGE_TYPES = /^image\/(png|jpeg|gif|webp|avif|bmp|x-icon|vnd\.microsoft\.icon)$/;
  // routes this page polls itself: left out of the request rate
  const OWN_ROUTES = new Set(["/metrics", "/readyz", "/healthz", "/ui", "/ui/{file}"]);

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    admin: false,
    history: [], // {t, req: {"2xx","4xx","5xx"}, created, dedup, steps: {...}}
    timer: 0,
    charts: [],
    listCursors: [""], // the "after" of each page seen, for Previous
  };

  // ---- small helpers ----------------------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  // h("td", {className: "num"}, "12", child): an element; strings become text nodes.
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "dataset") Object.assign(el.dataset, v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el[k] = v;
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  function fmtBytes(n) {
    if (!Number.isFinite(n)) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i++;
    }
    return (i ? n.toFixed(n < 10 ? 2 : 1) : String(n)) + " " + units[i];
  }

  function fmtInt(n) {
    return Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "–";
  }

  function fmtSecs(secs) {
    if (!Number.isFinite(secs)) return "–";
    if (secs >= 1) return secs.toFixed(2) + " s";
    if (secs >= 0.001) return (secs * 1000).toFixed(2) + " ms";
    return (secs * 1e6).toFixed(0) + " µs";
  }

  function ago(secs) {
    return secs < 90 ? Math.round(secs) + " s" : Math.round(secs / 60) + " min";
  }

  function fmtTime(iso) {
    return iso ? iso.replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC") : "–";
  }

  function hexOf(input) {
    const s = input.trim().toLowerCase().replace(/^sha256:/, "");
    return /^[0-9a-f]{64}$/.test(s) ? s : null;
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // fetch() against the API with the session's token; JSON errors become ApiError.
  async function api(path, opts = {}) {
    const headers = Object.assign({}, opts.headers || {});
    if (state.token) headers.Authorization = "Bearer " + state.token;
    const resp = await fetch(path, Object.assign({}, opts, { headers, cache: "no-store" }));
    if (!resp.ok && resp.status !== 206) {
      let code = "http_" + resp.status;
      let message = resp.statusText;
      try {
        const j = await resp.json();
        code = j.error.code;
        message = j.error.message;
      } catch (e) {
        /* not a JSON error body */
      }
      throw new ApiError(resp.status, code, message);
    }
    return resp;
  }

  async function apiJson(path, opts) {
    return (await api(path, opts)).json();
  }

  function banner(text) {
    const b = $("banner");
    b.textContent = text || "";
    b.hidden = !text;
  }

  // A readable line for a failed request; 401/403 say what to do.
  function explain(err) {
    if (err instanceof ApiError) {
      if (err.status === 401) return "This needs a token: enter one above (" + err.message + ").";
      if (err.status === 403) return "The token lacks the scope for this (" + err.message + ").";
      return err.code + ": " + err.message;
    }
    return String(err && err.message ? err.message : err);
  }

  function errorBox(err) {
    return h("p", { className: "error" }, explain(err));
  }

  // ---- token ------------------------------------------------------------------------------

  // Whether the caller may use admin routes: POST /v1/import with an empty list is an admin route
  // that changes nothing (200 with admin, 401/403 without).
  async function probeAdmin() {
    try {
      await api("/v1/import", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: '{"blobs":[]}',
      });
      return true;
    } catch (e) {
      return false;
    }
  }

  async function refreshToken() {
    state.admin = await probeAdmin();
    $("token-state").textContent =
      (state.token ? "token set" : "no token") + (state.admin ? " · admin" : "");
    $("token-clear").hidden = !state.token;
    document.body.classList.toggle("admin", state.admin);
  }

  function setupToken() {
    $("token-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      state.token = $("token-input").value.trim();
      $("token-input").value = "";
      if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
      else sessionStorage.removeItem(TOKEN_KEY);
      await refreshToken();
      route();
    });
    $("token-clear").addEventListener("click", async () => {
      state.token = "";
      sessionStorage.removeItem(TOKEN_KEY);
      await refreshToken();
      route();
    });
  }

  // ---- charts (uPlot) ---------------------------------------------------------------------

  function destroyCharts() {
    for (const c of state.charts) c.destroy();
    state.charts = [];
  }

  const PALETTE = ["#2563eb", "#d97706", "#dc2626", "#059669", "#7c3aed"];

  // Times on every chart are UTC, like every time the console prints.
  function utcDate(ts) {
    return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC");
  }

  // Time-axis ticks as 24-hour UTC: "HH:MM", with the date where it changes (and first).
  function utcTicks(u, splits) {
    let day = null;
    return splits.map((t) => {
      const iso = new Date(t * 1000).toISOString();
      const d = iso.slice(5, 10);
      const span = splits.length > 1 ? splits[1] - splits[0] : 60;
      const hm = span < 60 ? iso.slice(11, 19) : iso.slice(11, 16);
      const label = d !== day ? d + " " + hm : hm;
      day = d;
      return label;
    });
  }

  // The last finite value of a series, for its legend ("2xx: 3.20").
  function lastValue(data) {
    for (let i = data.length - 1; i >= 0; i--) if (Number.isFinite(data[i])) return data[i];
    return null;
  }

  // A uPlot chart in parent: xs (seconds) and named series, as lines, or as bars (opts.bars:
  // one group per x, e.g. per reconcile run). Legends carry each series' last value.
  function lineChart(parent, title, xs, series, opts = {}) {
    const width = Math.max(300, parent.clientWidth - 8);
    const n = series.length;
    const s = [{ label: "time (UTC)" }].concat(
      series.map((ser, i) => {
        const last = lastValue(ser.data);
        const fmt = ser.scale === "bytes" ? fmtBytes : opts.bars ? fmtInt : (v) => v.toFixed(2);
        const color = PALETTE[i % PALETTE.length];
        const out = {
          label: ser.label + ": " + (last === null ? "–" : fmt(last)),
          stroke: color,
          width: 2,
          scale: ser.scale || "y",
          points: { show: xs.length < 3 && !opts.bars },
          value: (u, v) => (v === null || v === undefined ? "–" : fmt(v)),
        };
        if (opts.bars) {
          out.fill = color + "cc";
          out.paths = uPlot.paths.bars({ size: [0.9, 24] });
        }
        return out;
      }),
    );
    const axes = [{ label: "UTC", labelSize: 18, values: utcTicks },
      { scale: "y", size: 60, values: opts.yValues }];
    const scales = { x: { time: true } };
    if (series.some((ser) => ser.scale === "bytes")) {
      axes.push({ scale: "bytes", side: 1, size: 70, values: (u, v) => v.map(fmtBytes), grid: { show: false } });
    }
    let data = [xs].concat(series.map((ser) => ser.data));
    let groupHalf = 0; /* bars: half the width of a run's group, in seconds */
    if (opts.bars && xs.length) {
      // a group per x: series i's bar at x + its slot offset (null in the other slots)
      // the narrowest spacing of runs, or a tenth of the axis for one run
      let gap = xs.length > 1 ? Infinity : (opts.minSpan || 60) / 10;
      for (let k = 1; k < xs.length; k++) if (xs[k] > xs[k - 1]) gap = Math.min(gap, xs[k] - xs[k - 1]);
      if (!Number.isFinite(gap)) gap = (opts.minSpan || 60) / 10;
      const w = (gap * 0.6) / n;
      groupHalf = (n / 2 + 0.5) * w;
      const x2 = [];
      const d2 = series.map(() => []);
      xs.forEach((x, k) => {
        for (let i = 0; i < n; i++) {
          x2.push(x + (i - (n - 1) / 2) * w);
          series.forEach((ser, j) => d2[j].push(j === i ? ser.data[k] : null));
        }
      });
      data = [x2].concat(d2);
    }
    const chart = new uPlot(
      { title: title + " · UTC", width, height: 220, series: s, axes, scales, tzDate: utcDate,
        legend: { live: false }, cursor: { drag: { x: false, y: false } } },
      data,
      parent,
    );
    parent.dataset.kind = opts.bars ? "bars" : "lines";
    // the time axis: at least minSpan seconds, ending at the last point (uPlot would make one
    // point a day wide, and no point an arbitrary range)
    const minSpan = opts.minSpan || 60;
    let hi = xs.length ? xs[xs.length - 1] : Date.now() / 1000;
    let lo = Math.min(xs.length ? xs[0] : hi, hi - minSpan);
    if (opts.bars) {
      // the runs' groups whole and centred: at least minSpan around first..last run
      lo = (xs.length ? xs[0] : hi) - groupHalf;
      hi += groupHalf;
      const grow = Math.max(0, minSpan - (hi - lo)) / 2;
      lo -= grow;
      hi += grow;
    }
    const pad = (hi - lo) * 0.02;
    chart.setScale("x", { min: lo - pad, max: hi + pad });
    parent.dataset.xMin = String(lo - pad);
    parent.dataset.xMax = String(hi + pad);
    state.charts.push(chart);
    return chart;
  }

  // ---- /metrics ---------------------------------------------------------------------------

  // Prometheus text → [{name, labels, value}].
  function parseMetrics(text) {
    const out = [];
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$/.exec(line);
      if (!m) continue;
      const labels = {};
      if (m[2]) for (const l of m[2].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
      out.push({ name: m[1], labels, value: parseFloat(m[3]) });
    }
    return out;
  }

  function pick(ms, name, pred) {
    return ms.filter((m) => m.name === name && (!pred || pred(m.labels)));
  }

  function total(ms, name, pred) {
    return pick(ms, name, pred).reduce((a, m) => a + m.value, 0);
  }

  // One sample of the counters the overview plots.
  function sample(ms) {
    const req = { "2xx": 0, "4xx": 0, "5xx": 0 };
    for (const m of pick(ms, "blobref_http_requests_total", (l) => !OWN_ROUTES.has(l.route))) {
      const k = m.labels.code === "5xx" ? "5xx" : m.labels.code === "4xx" ? "4xx" : "2xx";
      req[k] += m.value;
    }
    const steps = {};
    for (const m of pick(ms, "blobref_upload_step_seconds_total")) steps[m.labels.step] = m.value;
    return {
      t: Date.now() / 1000,
      req,
      created: total(ms, "blobref_uploads_total", (l) => l.result === "created"),
      dedup: total(ms, "blobref_uploads_total", (l) => l.result === "dedup"),
      steps,
    };
  }

  // Per-second rates between consecutive samples.
  function rates(hist, f) {
    const xs = [];
    const ys = [];
    for (let i = 1; i < hist.length; i++) {
      const dt = hist[i].t - hist[i - 1].t;
      if (dt <= 0) continue;
      xs.push(hist[i].t);
      ys.push(Math.max(0, (f(hist[i]) - f(hist[i - 1])) / dt));
    }
    return [xs, ys];
  }

  // ---- overview ---------------------------------------------------------------------------

  function card(label, value, extra, id) {
    return h("div", { className: "card", id: id || "" }, h("div", { className: "label" }, label),
      h("div", { className: "value" }, value), extra ? h("div", { className: "extra" }, extra) : null);
  }

  async function renderOverview(view) {
    let text, ready;
    try {
      text = await (await api("/metrics")).text();
    } catch (e) {
      view.replaceChildren(h("h2", {}, "Overview"), errorBox(e));
      return;
    }
    try {
      ready = await (await fetch("/readyz", { cache: "no-store" })).json();
    } catch (e) {
      ready = { error: { message: String(e) } };
    }
    const ms = parseMetrics(text);
    const now = sample(ms);
    const hist = state.history;
    hist.push(now);
    while (hist.length > 2 && now.t - hist[0].t > HISTORY_MS / 1000) hist.shift();

    const blobs = (s) => total(ms, "blobref_index_blobs", (l) => l.state === s);
    const bytes = (s) => total(ms, "blobref_index_blob_bytes", (l) => l.state === s);
    const mapSize = total(ms, "blobref_index_map_bytes");
    const mapUsed = total(ms, "blobref_index_used_bytes");
    const fill = mapSize ? mapUsed / mapSize : 0;
    const meter = h("progress", { max: 1, value: fill });
    const fillCard = card("Index fill", (fill * 100).toFixed(1) + " %",
      [meter, h("span", {}, fmtBytes(mapUsed) + " of " + fmtBytes(mapSize) + " map")], "card-fill");
    if (fill >= 0.8) {
      fillCard.classList.add("warn");
      fillCard.append(h("div", { className: "warning" },
        "The index map is nearly full: raise index_map_size before uploads fail with index_full."));
    }
    const cards = h("section", { className: "cards" },
      card("Live blobs", fmtInt(blobs("live")), fmtBytes(bytes("live")), "card-live"),
      card("Quarantined", fmtInt(blobs("quarantined") + blobs("held")),
        fmtInt(blobs("held")) + " held by an admin · " +
        fmtBytes(bytes("quarantined") + bytes("held")), "card-quarantined"),
      card("Bytes stored", fmtBytes(bytes("live") + bytes("quarantined") + bytes("held")),
        fmtInt(total(ms, "blobref_index_entries")) + " index entries", "card-bytes"),
      fillCard);

    // stores: health from /metrics (blobref_store_up), the first problem from /readyz
    const storeRows = pick(ms, "blobref_store_up").map((m) => {
      const name = m.labels.store;
      const errs = (op) => total(ms, "blobref_store_errors_total", (l) => l.store === name && l.op === op);
      const up = m.value === 1;
      return h("tr", {},
        h("td", {}, name),
        h("td", {}, h("span", { className: up ? "ok" : "bad" }, up ? "healthy" : "failing")),
        h("td", { className: "num store-blobs" }, fmtInt(total(ms, "blobref_store_blobs", (l) => l.store === name))),
        h("td", { className: "num store-bytes" }, fmtBytes(total(ms, "blobref_store_blob_bytes", (l) => l.store === name))),
        h("td", { className: "num" }, fmtInt(errs("read"))),
        h("td", { className: "num" }, fmtInt(errs("write"))),
        h("td", { className: "num" }, fmtInt(errs("check"))));
    });
    const readyText = ready && ready.status === "ready" ? "ready" :
      "not ready: " + (ready && ready.error ? ready.error.message : "unknown");
    const stores = h("section", { className: "panel" }, h("h3", {}, "Stores"),
      h("p", { className: ready && ready.status === "ready" ? "ok" : "bad", id: "readyz" }, "/readyz: " + readyText),
      h("table", { id: "stores" },
        h("thead", {}, h("tr", {}, h("th", {}, "store"), h("th", {}, "health"),
          h("th", { className: "num" }, "live blobs"), h("th", { className: "num" }, "bytes"),
          h("th", { className: "num" }, "read errors"), h("th", { className: "num" }, "write errors"),
          h("th", { className: "num" }, "check errors"))),
        h("tbody", {}, storeRows)));

    // upload time per step: since the start, and over the plotted window, per upload stored
    // (deduplicated uploads mostly skip the steps: they are not counted in the mean)
    const first = hist[0];
    const stored = now.created;
    const windowStored = stored - first.created;
    const stepRows = Object.keys(now.steps).map((step) => {
      const secs = now.steps[step];
      const win = secs - (first.steps[step] || 0);
      return h("tr", {}, h("td", {}, step),
        h("td", { className: "num" }, fmtSecs(secs)),
        h("td", { className: "num" }, stored ? fmtSecs(secs / stored) : "–"),
        h("td", { className: "num" }, windowStored > 0 ? fmtSecs(win / windowStored) : "–"));
    });
    const steps = h("section", { className: "panel" }, h("h3", {}, "Upload time per step"),
      h("table", { id: "steps" },
        h("thead", {}, h("tr", {}, h("th", {}, "step"), h("th", { className: "num" }, "all uploads"),
          h("th", { className: "num" }, "per upload stored"),
          h("th", { className: "num" }, "mean, last " + ago(now.t - first.t)))),
        h("tbody", {}, stepRows)),
      h("p", { className: "note" }, fmtInt(now.created) + " uploads created, " + fmtInt(now.dedup) +
        " deduplicated since the server started."));

    const reqChart = h("div", { className: "chart", id: "chart-requests" });
    const upChart = h("div", { className: "chart", id: "chart-uploads" });
    const charts = h("section", { className: "panel" },
      h("h3", {}, "Rates (polled every " + POLL_MS / 1000 + " s)"),
      h("p", { className: "note" }, "API requests per second by status class (without /metrics, /readyz and /ui, which this page polls), and uploads per second."),
      h("div", { className: "charts" }, reqChart, upChart));

    destroyCharts();
    view.replaceChildren(h("h2", {}, "Overview"), cards, charts, h("div", { className: "two" }, stores, steps));
    const [xs, r2] = rates(hist, (s) => s.req["2xx"]);
    const r4 = rates(hist, (s) => s.req["4xx"])[1];
    const r5 = rates(hist, (s) => s.req["5xx"])[1];
    lineChart(reqChart, "requests/s", xs, [
      { label: "2xx", data: r2 }, { label: "4xx", data: r4 }, { label: "5xx", data: r5 }]);
    const uc = rates(hist, (s) => s.created)[1];
    const ud = rates(hist, (s) => s.dedup)[1];
    lineChart(upChart, "uploads/s", xs, [{ label: "created", data: uc }, { label: "dedup", data: ud }]);
    view.dataset.ready = "1";
  }

  // ---- reconcile --------------------------------------------------------------------------

  const RUN_COLS = ["marked", "quarantined", "restored", "deleted"];

  // A run that ended but that a guard (max_fraction) refused shows as refused, not done.
  function runState(run) {
    return run.state === "done" && run.refused ? "refused" : run.state;
  }

  function runRow(run) {
    const b = run.blobs || {};
    return h("tr", { className: "clickable", onclick: () => (location.hash = "#reconcile/" + run.id) },
      h("td", { className: "num" }, h("a", { href: "#reconcile/" + run.id }, "#" + run.id)),
      h("td", {}, fmtTime(run.started_at)),
      h("td", {}, h("span", { className: "state-" + runState(run) }, runState(run)), run.dry_run ? " (dry run)" : ""),
      RUN_COLS.map((c) => h("td", { className: "num" }, b[c] === undefined ? "–" : fmtInt(b[c]))),
      h("td", { className: "num" }, run.bytes_reclaimed === undefined ? "–" : fmtBytes(run.bytes_reclaimed)),
      h("td", { className: "num" }, run.phases ? ((run.phases.mark_ms + run.phases.sweep_ms + run.phases.delete_ms) / 1000).toFixed(2) + " s" : "–"));
  }

  function dryRunButton(status) {
    const btn = h("button", { id: "dry-run", className: "admin-only" }, "Dry run");
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      status.textContent = "starting a dry run…";
      try {
        const started = await apiJson("/v1/reconcile?dry_run=1", { method: "POST" });
        let run = started;
        for (let i = 0; i < 600 && run.state === "running"; i++) {
          await new Promise((r) => setTimeout(r, 300));
          run = await apiJson("/v1/reconcile/runs/" + started.id);
        }
        location.hash = "#reconcile/" + started.id;
      } catch (e) {
        status.textContent = explain(e);
        btn.disabled = false;
      }
    });
    return btn;
  }

  async function renderReconcile(view, id) {
    if (id) return renderRun(view, id);
    const status = h("span", { className: "note", id: "dry-run-status" });
    const head = h("div", { className: "toolbar" }, h("h2", {}, "Reconcile"),
      state.admin ? dryRunButton(status) : null, status);
    let runs, next;
    try {
      const got = await apiJson("/v1/reconcile/runs");
      runs = got.runs;
      next = got.next_run_at;
    } catch (e) {
      view.replaceChildren(head, errorBox(e));
      return;
    }
    const chartBox = h("div", { className: "chart", id: "chart-runs" });
    const table = h("table", { id: "runs" },
      h("thead", {}, h("tr", {}, h("th", { className: "num" }, "run"), h("th", {}, "started"), h("th", {}, "state"),
        RUN_COLS.map((c) => h("th", { className: "num" }, c)), h("th", { className: "num" }, "reclaimed"),
        h("th", { className: "num" }, "took"))),
      h("tbody", {}, runs.map(runRow)));
    destroyCharts();
    view.replaceChildren(head,
      h("p", { className: "note" }, state.admin
        ? "A dry run changes nothing and reports exactly what a real run would do."
        : "Runs start every interval inside the server; an admin token shows the dry-run button."),
      runs.length ? h("p", { id: "last-run" }, "Last run: #" + runs[0].id + ", started " +
        fmtTime(runs[0].started_at) + " (" + runs[0].state + ")") : null,
      h("p", { id: "next-run" }, next ? "Next periodic run: " + fmtTime(next) :
        "No periodic run scheduled (reconcile interval = 0, or a run is under way)."),
      h("section", { className: "panel" }, chartBox),
      runs.length ? table : h("p", { id: "no-runs" }, "No runs yet."));
    const done = runs.filter((r) => r.blobs && r.started_at).reverse();
    const xs = done.map((r) => Date.parse(r.started_at) / 1000);
    lineChart(chartBox, "blobs per run, and bytes reclaimed", xs,
      RUN_COLS.map((c) => ({ label: c, data: done.map((r) => r.blobs[c]) })).concat(
        [{ label: "bytes reclaimed", data: done.map((r) => r.bytes_reclaimed), scale: "bytes" }]),
      { minSpan: 3600, bars: true });
    view.dataset.ready = "1";
  }

  // ---- jobs (admin) -----------------------------------------------------------------------

  function jobWhat(job) {
    const p = job.params || {};
    return job.kind === "migrate" ? p.from + " → " + p.to + (p.dry_run ? " (dry run)" : "")
      : p.store + ":" + (p.prefix || "") + " (" + p.mode + ")";
  }

  function jobRow(job) {
    const items = job.items_done + job.items_skipped + job.items_failed;
    // by items: a skipped one (indexed or moved already) adds no bytes but is done with
    const frac = job.items_total ? items / job.items_total : job.state === "running" ? 0 : 1;
    const eta = typeof job.eta_s === "number" ? Math.round(job.eta_s) + " s" : "–";
    const lastErr = job.errors && job.errors[0];
    return h("tr", { id: "job-" + job.id },
      h("td", { className: "num" }, "#" + job.id),
      h("td", {}, job.kind),
      h("td", {}, jobWhat(job)),
      h("td", {}, h("span", { className: "state-" + job.state }, job.state)),
      h("td", {}, h("progress", { max: 1, value: Math.min(1, frac) }), " " + Math.floor(frac * 100) + "%"),
      h("td", { className: "num" }, fmtInt(items) + " / " + fmtInt(job.items_total)),
      h("td", { className: "num" }, fmtBytes(job.bytes_done) + " / " + fmtBytes(job.bytes_total)),
      h("td", { className: "num" }, job.state === "running" ? fmtBytes(job.rate_bytes_per_s) + "/s" : "–"),
      h("td", { className: "num" }, eta),
      h("td", { className: "num", title: lastErr ? lastErr.item + ": " + lastErr.message : "" }, fmtInt(job.items_failed)));
  }

  async function renderJobs(view) {
    const head = h("div", { className: "toolbar" }, h("h2", {}, "Jobs"));
    if (!state.admin) {
      view.replaceChildren(head, h("p", { className: "note", id: "jobs-need-admin" },
        "Migrate and import jobs are shown with an admin token."));
      view.dataset.ready = "1";
      return false;
    }
    let jobs;
    try {
      jobs = (await apiJson("/v1/jobs")).jobs;
    } catch (e) {
      view.replaceChildren(head, errorBox(e));
      return false;
    }
    const table = h("table", { id: "jobs" },
      h("thead", {}, h("tr", {}, ["job", "kind", "what", "state", "progress", "items", "bytes", "rate", "ETA", "errors"]
        .map((c, i) => h("th", { className: i >= 5 ? "num" : "" }, c)))),
      h("tbody", {}, jobs.map(jobRow)));
    view.replaceChildren(head,
      h("p", { className: "note" }, "blobref migrate and blobref import run here as jobs; blobref jobs cancel ID stops one."),
      jobs.length ? table : h("p", { id: "no-jobs" }, "No jobs yet."));
    view.dataset.ready = "1";
    return jobs.some((j) => j.state === "running" || j.state === "queued");
  }

  function dl(pairs) {
    return h("dl", {}, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  async function renderRun(view, id) {
    let run;
    try {
      run = await apiJson("/v1/reconcile/runs/" + encodeURIComponent(id));
    } catch (e) {
      view.replaceChildren(h("h2", {}, "Run #" + id), errorBox(e));
      return;
    }
    const b = run.blobs || {};
    const p = run.phases || {};
    const title = "Run #" + run.id + (run.dry_run ? " — dry run: what a real run would do" : "");
    const errors = run.errors || [];
    view.replaceChildren(
      h("p", {}, h("a", { href: "#reconcile" }, "← all runs")),
      h("h2", { id: "run-title" }, title),
      h("div", { className: "two" },
        h("section", { className: "panel" }, h("h3", {}, "Summary"), dl([
          ["state", h("span", { className: "state-" + runState(run), id: "run-state" }, runState(run))],
          ["started", fmtTime(run.started_at)], ["finished", fmtTime(run.finished_at)],
          ["options", ["dry_run", "force", "full"].filter((k) => run[k]).join(", ") || "none"],
          ["references", fmtInt(run.references)], ["references missing", fmtInt(run.references_missing)],
          ["refused", run.refused || "–"]])),
        h("section", { className: "panel" }, h("h3", {}, "Blobs"), dl([
          ["live", fmtInt(b.live)], ["marked", fmtInt(b.marked)], ["quarantined", fmtInt(b.quarantined)],
          ["restored", fmtInt(b.restored)], ["deleted", fmtInt(b.deleted)],
          ["held while referenced", fmtInt(b.held_referenced)], ["bytes reclaimed", fmtBytes(run.bytes_reclaimed)]]))),
      h("div", { className: "two" },
        h("section", { className: "panel" }, h("h3", {}, "Phases"), dl([
          ["mark", p.mark_ms === undefined ? "–" : p.mark_ms + " ms"],
          ["sweep", p.sweep_ms === undefined ? "–" : p.sweep_ms + " ms"],
          ["delete", p.delete_ms === undefined ? "–" : p.delete_ms + " ms"],
          ["spill runs", fmtInt(run.spill_runs)]])),
        h("section", { className: "panel" }, h("h3", {}, "Errors"),
          errors.length ? h("ul", { id: "run-errors" }, errors.map((e) => h("li", { className: "error" }, typeof e === "string" ? e : JSON.stringify(e))))
            : h("p", {}, "none"))),
      (run.tables || []).length ? h("section", { className: "panel" }, h("h3", {}, "Tables"),
        h("table", {}, h("thead", {}, h("tr", {}, Object.keys(run.tables[0]).map((k) => h("th", {}, k)))),
          h("tbody", {}, run.tables.map((t) => h("tr", {}, Object.values(t).map((v) => h("td", {}, String(v)))))))) : null,
      run.lists ? await runLists(run)
        : run.lists === null ? h("section", { className: "panel", id: "run-lists" }, h("h3", {}, "Blobs"),
          h("p", {}, "this run recorded counts only ([reconcile] lists = false)")) : null);
    view.dataset.ready = "1";
  }

  // The run's blobs per action (the first RUN_LIST_PAGE of each), each linked to its blob page.
  const RUN_LIST_PAGE = 100;
  async function runLists(run) {
    const actions = ["quarantined", "restored", "deleted", "held", "pending"];
    const parts = [];
    for (const a of actions) {
      const n = run.lists[a] || 0;
      if (!n) continue;
      let page;
      try {
        page = await apiJson("/v1/reconcile/runs/" + run.id + "/blobs?action=" + a + "&limit=" + RUN_LIST_PAGE);
      } catch (e) {
        parts.push(h("div", { id: "run-list-" + a }, h("h4", {}, a), errorBox(e)));
        continue;
      }
      parts.push(h("div", { id: "run-list-" + a },
        h("h4", {}, a + " (" + fmtInt(n) + (n > page.blobs.length ? ", the first " + page.blobs.length + " shown" : "") + ")"),
        h("ul", { className: "mono" }, page.blobs.map((x) => h("li", {},
          h("a", { href: "#blob/" + x.sha256 }, x.sha256),
          x.eligible_at ? " eligible at " + fmtTime(x.eligible_at) : "")))));
    }
    return h("section", { className: "panel", id: "run-lists" }, h("h3", {}, "Blobs"),
      parts.length ? parts : h("p", {}, "none listed"));
  }

  // ---- blobs ------------------------------------------------------------------------------

  async function renderBlobPage(view, hex) {
    const input = h("input", { id: "blob-search", type: "search", placeholder: "sha256:… or 64 hex digits", value: hex || "", size: 72 });
    const form = h("form", { className: "toolbar", id: "blob-form" }, h("h2", {}, "Blobs"), input,
      h("button", { type: "submit" }, "Show"));
    const msg = h("p", { className: "error", id: "blob-error" });
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const x = hexOf(input.value);
      if (!x) {
        msg.textContent = "A blob id is 64 hex digits, optionally after sha256:.";
        return;
      }
      location.hash = "#blob/" + x;
    });
    const detail = h("div", { id: "blob-detail" });
    const list = h("section", { className: "panel", id: "blob-list" });
    destroyCharts();
    view.replaceChildren(form, msg, detail, list);
    if (hex) await renderBlob(detail, hex);
    await renderList(list, state.listCursors[state.listCursors.length - 1]);
    view.dataset.ready = "1";
  }

  async function renderBlob(box, hex) {
    let rec;
    try {
      rec = await apiJson("/v1/blobs/" + hex + "/meta");
    } catch (e) {
      box.replaceChildren(errorBox(e));
      return;
    }
    const quarantined = rec.state !== "live";
    const q = rec.quarantine || {};
    const actions = h("div", { className: "toolbar" });
    if (!quarantined) actions.append(downloadButton(rec));
    if (state.admin) {
      const act = quarantined
        ? h("button", { id: "blob-restore", className: "admin-only" }, "Restore")
        : h("button", { id: "blob-quarantine", className: "admin-only danger" }, "Quarantine");
      act.addEventListener("click", async () => {
        act.disabled = true;
        try {
          if (quarantined) await api("/v1/blobs/" + hex + "/restore", { method: "POST" });
          else await api("/v1/blobs/" + hex + "?reason=" + encodeURIComponent("console"), { method: "DELETE" });
          await renderBlob(box, hex);
        } catch (e) {
          act.disabled = false;
          actions.append(errorBox(e));
        }
      });
      actions.append(act);
    }
    const preview = h("div", { className: "preview", id: "blob-preview" });
    box.replaceChildren(h("section", { className: "panel" },
      h("h3", { className: "hash" }, "sha256:" + rec.sha256),
      h("div", { className: "two" },
        h("div", {},
          dl([
            ["state", h("span", { id: "blob-state", className: quarantined ? "bad" : "ok" },
              quarantined ? "quarantined" + (q.by === "admin" ? " (held by an admin)" : " (by reconcile)") : "live")],
            quarantined ? ["reason", q.reason || "–"] : null,
            quarantined ? ["since", fmtTime(q.at)] : null,
            ["size", fmtBytes(rec.size) + " (" + fmtInt(rec.size) + " bytes)"],
            ["content type", rec.content_type],
            ["created", fmtTime(rec.created_at)],
            ["last upload", fmtTime(rec.last_upload_at)],
          ].filter(Boolean)),
          h("h4", {}, "Locations"),
          h("table", { id: "blob-locations" },
            h("thead", {}, h("tr", {}, h("th", {}, "store"), h("th", {}, "key"), h("th", {}, "role"), h("th", {}, "verified"))),
            h("tbody", {}, rec.locations.map((l) => h("tr", {}, h("td", {}, l.store), h("td", { className: "key" }, l.key),
              h("td", {}, l.role), h("td", {}, fmtTime(l.verified_at)))))),
          actions),
        preview)));
    const why = h("section", { className: "panel", id: "blob-why" }, h("h4", {}, "Why it is here"),
      h("p", { className: "note" }, "Reading the tables…"));
    box.append(why);
    if (quarantined && !state.admin)
      preview.append(h("p", { className: "note" }, "Quarantined blobs are not served (410): only an admin can preview them."));
    else await renderPreview(preview, rec);
    await renderWhy(why, hex);
  }

  // GET /v1/blobs/{hash}/refs: the tables, snapshots (with their times) and data files that keep
  // the blob, or why an unreferenced one is not quarantined yet (grace, lease, hold).
  async function renderWhy(box, hex) {
    let r;
    try {
      r = await apiJson("/v1/blobs/" + hex + "/refs");
    } catch (e) {
      box.replaceChildren(h("h4", {}, "Why it is here"), errorBox(e));
      return;
    }
    const rows = [];
    for (const t of r.tables) {
      if (t.error) {
        rows.push(h("tr", { className: "bad" }, h("td", {}, t.name), h("td", { colSpan: 3 }, t.error)));
        continue;
      }
      const times = new Map((t.snapshots || []).map((s) => [s.id, s.timestamp]));
      for (const f of t.data_files)
        for (const id of f.snapshots)
          rows.push(h("tr", {}, h("td", {}, t.name + " (" + t.format + ")"), h("td", { className: "snap" }, String(id)),
            h("td", {}, times.get(id) ? fmtTime(times.get(id)) : "–"), h("td", { className: "key" }, f.path)));
    }
    box.replaceChildren(h("h4", {}, "Why it is here"),
      h("p", { id: "blob-why-text", className: r.referenced ? "ok" : "" }, r.why),
      rows.length
        ? h("table", { id: "blob-refs" },
          h("thead", {}, h("tr", {}, h("th", {}, "table"), h("th", {}, "snapshot"), h("th", {}, "committed"), h("th", {}, "data file"))),
          h("tbody", {}, rows))
        : h("p", { className: "note" }, "No retained snapshot of a configured table references it."));
  }

  // Bytes of a blob as a Blob object (with the token when there is one); a held or quarantined
  // one through the admin's preview route (private, no-store, never redirected).
  async function fetchBlob(rec, range) {
    const path = "/v1/blobs/" + rec.sha256 + (rec.state !== "live" ? "/preview" : "");
    const resp = await api(path, range ? { headers: { Range: range } } : {});
    return resp.blob();
  }

  function downloadButton(rec) {
    if (!state.token) {
      // no header to send: the browser streams it straight from the API
      return h("a", { className: "button", id: "blob-download", href: "/v1/blobs/" + rec.sha256, download: rec.sha256 }, "Download");
    }
    const btn = h("button", { id: "blob-download" }, "Download");
    btn.addEventListener("click", async () => {
      const data = await fetchBlob(rec);
      const url = URL.createObjectURL(data);
      const a = h("a", { href: url, download: rec.sha256 });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    });
    return btn;
  }

  async function renderPreview(box, rec) {
    try {
      const type = (rec.content_type || "").split(";")[0].trim().toLowerCase();
      if (IMAGE_TYPES.test(type)) {
        const img = h("img", { id: "blob-img", alt: "preview of " + rec.sha256 });
        if (state.token || rec.state !== "live") {
          // <img> cannot send Authorization: fetch the bytes and show them from a blob: URL
          const data = await fetchBlob(rec);
          const url = URL.createObjectURL(new Blob([data], { type }));
          img.addEventListener("load", () => URL.revokeObjectURL(url), { once: true });
          img.src = url;
        } else {
          img.src = "/v1/blobs/" + rec.sha256;
        }
        box.replaceChildren(h("h4", {}, rec.state !== "live" ? "Preview (admin, not served to others)" : "Preview"), img);
        return;
      }
      const n = Math.min(rec.size, 512);
      const data = n ? new Uint8Array(await (await fetchBlob(rec, "bytes=0-" + (n - 1))).arrayBuffer()) : new Uint8Array();
      box.replaceChildren(h("h4", {}, "First " + data.length + " bytes"),
        h("pre", { className: "hexdump", id: "blob-hexdump" }, hexdump(data)));
    } catch (e) {
      box.replaceChildren(errorBox(e));
    }
  }

  // Classic 16-bytes-a-line dump: offset, hex, printable ASCII (a string, shown as text).
  function hexdump(bytes) {
    const lines = [];
    for (let off = 0; off < bytes.length; off += 16) {
      const row = bytes.subarray(off, off + 16);
      const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
      const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
      lines.push(off.toString(16).padStart(8, "0") + "  " + hex.padEnd(48) + "  " + ascii);
    }
    return lines.join("\n");
  }

  // The paged listing: GET /v1/blobs is in hash order (the index has no time order).
  async function renderList(box, after) {
    let page;
    try {
      page = await apiJson("/v1/blobs?limit=" + PAGE + (after ? "&after=" + after : ""));
    } catch (e) {
      box.replaceChildren(h("h3", {}, "Index"), errorBox(e));
      return;
    }
    const prev = h("button", { id: "list-prev", disabled: state.listCursors.length < 2 }, "← Previous");
    const next = h("button", { id: "list-next", disabled: !page.next }, "Next →");
    prev.addEventListener("click", () => {
      state.listCursors.pop();
      renderList(box, state.listCursors[state.listCursors.length - 1]);
    });
    next.addEventListener("click", () => {
      state.listCursors.push(page.next);
      renderList(box, page.next);
    });
    box.replaceChildren(h("h3", {}, "Index, page " + state.listCursors.length),
      h("p", { className: "note" }, "In hash order, " + PAGE + " a page: the listing has no upload-time order."),
      h("table", { id: "blob-table" },
        h("thead", {}, h("tr", {}, h("th", {}, "sha256"), h("th", { className: "num" }, "size"), h("th", {}, "type"),
          h("th", {}, "state"), h("th", {}, "last upload"))),
        h("tbody", {}, page.blobs.map((b) => h("tr", {},
          h("td", { className: "key" }, h("a", { href: "#blob/" + b.sha256 }, b.sha256.slice(0, 16) + "…")),
          h("td", { className: "num" }, fmtBytes(b.size)), h("td", {}, b.content_type),
          h("td", {}, h("span", { className: b.state === "live" ? "ok" : "bad" }, b.state)),
          h("td", {}, fmtTime(b.last_upload_at)))))),
      h("div", { className: "toolbar" }, prev, next));
  }

  // ---- routing ----------------------------------------------------------------------------

  let routeSeq = 0;

  async function route() {
    const seq = ++routeSeq;
    clearTimeout(state.timer);
    const [name, arg] = (location.hash.slice(1) || "overview").split("/");
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === name);
    // a fresh container per visit: a slow answer for an old view never lands in a new one
    const view = h("main", { id: "view", className: "view-" + name });
    $("view").replaceWith(view);
    banner("");
    try {
      if (name === "reconcile") await renderReconcile(view, arg);
      else if (name === "jobs") {
        if ((await renderJobs(view)) && seq === routeSeq) state.timer = setTimeout(route, 1000);
      }
      else if (name === "blob") await renderBlobPage(view, arg && hexOf(arg));
      else {
        await renderOverview(view);
        if (seq === routeSeq) state.timer = setTimeout(route, POLL_MS);
      }
    } catch (e) {
      banner(explain(e));
      console.warn("console: " + explain(e));
    }
  }

  async function start() {
    setupToken();
    await refreshToken();
    window.addEventListener("hashchange", () => {
      state.listCursors = [state.listCursors[0]];
      route();
    });
    window.addEventListener("resize", () => {
      for (const c of state.charts) c.setSize({ width: Math.max(300, c.root.parentNode.clientWidth - 8), height: 220 });
    });
    await route();
  }

  start();
})();
