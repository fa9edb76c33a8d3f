// The dashboard: a stream of snapshots from GET /ui/api/events (at most one a second,
// as blocks are verified), reconnecting whenever the stream ends (a server restart).
// Every number shown under [data-metric] is a /metrics sample of the snapshot (the
// sum of those with the given labels; with data-per, a quotient of two), every
// number in the requests table a field of that request's usage or x_dflash.
"use strict";

(() => {
  const { el, fmt } = DF;
  const $ = (id) => document.getElementById(id);
  const SOURCES = [
    ["draft", "drafted"],
    ["lookup", "copied"],
    ["splice", "spliced"],
    ["plain", "plain"],
  ];
  const STALE_MS = 12000; // no snapshot for this long (one comes every 5 s): reconnect
  let last = null; // the latest snapshot
  let current = null; // the stream's AbortController

  function setConn(state, text) {
    const c = $("conn");
    c.dataset.state = state;
    c.textContent = text;
  }

  // -- /metrics samples -------------------------------------------------------------
  function parseSpec(spec) {
    const brace = spec.indexOf("{");
    const name = brace < 0 ? spec : spec.slice(0, brace);
    const labels = {};
    if (brace >= 0) {
      for (const m of spec.slice(brace).matchAll(/(\w+)="([^"]*)"/g)) labels[m[1]] = m[2];
    }
    return { name, labels };
  }

  // The sum of the samples named `spec`'s name that carry its labels.
  function metric(metrics, spec) {
    const want = parseSpec(spec);
    let total = 0;
    for (const [key, value] of Object.entries(metrics)) {
      const have = parseSpec(key);
      if (have.name !== want.name) continue;
      if (Object.entries(want.labels).every(([k, v]) => have.labels[k] === v)) total += value;
    }
    return total;
  }

  function show(node, value, format) {
    node.dataset.value = value == null ? "" : String(value);
    node.textContent = (fmt[format] || fmt.int)(value);
  }

  function renderMetrics(metrics) {
    for (const node of document.querySelectorAll("[data-metric]")) {
      let value = metric(metrics, node.dataset.metric);
      if (node.dataset.per) {
        const per = metric(metrics, node.dataset.per);
        value = per ? value / per : null;
      }
      show(node, value, node.dataset.format);
    }
    // requests by outcome, one number per status /metrics knows
    const statuses = {};
    for (const key of Object.keys(metrics)) {
      const { name, labels } = parseSpec(key);
      if (name === "dflash_requests_total") statuses[labels.status] = true;
    }
    const parts = [];
    for (const status of Object.keys(statuses).sort((a, b) => (a === "ok" ? -1 : b === "ok" ? 1 : a < b ? -1 : 1))) {
      const n = el("span", { className: "num", data: { metric: `dflash_requests_total{status="${status}"}` } });
      show(n, metric(metrics, n.dataset.metric), "int");
      if (parts.length) parts.push(" · ");
      parts.push(n, ` ${status}`);
    }
    $("t-requests").replaceChildren(...(parts.length ? parts : ["none yet"]));
    // the share of tokens by source, as a bar
    const counts = SOURCES.map(([s]) => metric(metrics, `dflash_tokens_by_source_total{source="${s}"}`));
    sourceBar($("source-bar"), counts);
  }

  function sourceBar(node, counts) {
    const total = counts.reduce((a, b) => a + b, 0);
    node.replaceChildren(
      ...SOURCES.map(([s, label], i) => {
        const part = el("i", { className: s, title: `${label}: ${counts[i]} tok` });
        part.style.width = `${total ? (100 * counts[i]) / total : 0}%`; // CSSOM: CSP allows it
        return part;
      })
    );
  }

  // -- the server card --------------------------------------------------------------
  function renderServer(server, cache) {
    $("model").textContent = server.model + (server.draft ? "  +  " + server.draft : "");
    $("s-model").textContent = server.model;
    $("s-draft").textContent = server.draft || "none (plain decoding)";
    let engine = DF.modeLabel(server.mode, server.block_size);
    if (server.mode === "dflash") engine += ` (blocks up to ${server.max_block})`;
    if (server.mode === "dflash" && server.lookup) engine += " + prompt lookup";
    if (server.kv_bits) engine += ` · KV ${server.kv_bits}-bit (one request at a time)`;
    $("s-engine").textContent = engine;
    const k = server.kernels || {};
    $("s-kernels").textContent = `target ${k.target || "?"}` + (k.draft ? ` · drafter ${k.draft}` : "");
    let device = server.device + (server.blas ? ` · BLAS ${server.blas}` : "");
    if (server.ranks > 1) device += ` · ${server.ranks} ranks`;
    $("s-device").textContent = device;
    $("s-limits").textContent =
      `${server.max_concurrency} at once, ${server.max_queue} queued, ${server.max_tokens} tokens max` +
      (server.context_length ? `, context ${server.context_length}` : "");
    $("s-version").textContent = server.version;
    $("s-uptime").textContent = fmt.duration(server.uptime_s);
    show($("pc-lookups"), cache.hits + cache.misses, "int");
    show($("pc-max"), cache.max_bytes, "bytes");
    show($("pc-entries"), cache.entries, "int");
    $("pc-disk").textContent = cache.disk ? `of ${fmt.bytes(cache.disk.max_bytes)} in ${cache.disk.dir}` : "(no --prompt-cache-dir)";
  }

  function renderDecoding(d, server) {
    const banner = $("decoding");
    if (d.plain) {
      banner.hidden = false;
      banner.dataset.state = "plain";
      banner.replaceChildren(el("strong", { text: "Decoding plainly" }), ` (no proposals verified in the last ${d.window_s} s). `, d.why || "");
    } else if (d.proposed_blocks || d.plain_blocks) {
      banner.hidden = false;
      banner.dataset.state = "speculating";
      const all = d.proposed_blocks + d.plain_blocks;
      const share = Math.round((100 * d.proposed_blocks) / all);
      banner.replaceChildren(
        el("strong", { text: "Speculating" }),
        `: ${share}% of the last ${d.window_s} s's ${all} blocks verified proposals (${DF.modeLabel(server.mode, server.block_size)}).`
      );
    } else {
      banner.hidden = true;
    }
  }

  // -- the plot -----------------------------------------------------------------------
  function means(values, width) {
    const out = [];
    let sum = 0;
    for (let i = 0; i < values.length; i++) {
      sum += values[i];
      if (i >= width) sum -= values[i - width];
      out.push(sum / Math.min(i + 1, width));
    }
    return out;
  }

  function niceCeil(x) {
    if (x <= 0) return 10;
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }

  function renderPlot(perSecond) {
    const canvas = $("plot");
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    canvas.width = Math.round(w * ratio);
    canvas.height = Math.round(h * ratio);
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    const css = getComputedStyle(document.body);
    const color = (name) => css.getPropertyValue(name).trim();
    // the current second is still counting: the plot ends at the last whole one
    const done = perSecond.slice(0, -1);
    const smooth = means(done, 5);
    const now = smooth.length ? smooth[smooth.length - 1] : 0;
    $("now-rate").textContent = fmt.f1(now);
    $("peak-rate").textContent = fmt.f1(Math.max(0, ...smooth));
    const top = niceCeil(Math.max(1, ...done));
    const left = 44;
    const bottom = h - 18;
    const plotW = w - left - 8;
    const x = (i) => left + (plotW * i) / Math.max(1, done.length - 1);
    const y = (v) => 6 + (bottom - 6) * (1 - v / top);
    g.clearRect(0, 0, w, h);
    g.font = "11px system-ui, sans-serif";
    g.fillStyle = color("--muted");
    g.strokeStyle = color("--grid");
    g.lineWidth = 1;
    for (const f of [0, 0.5, 1]) {
      g.beginPath();
      g.moveTo(left, y(top * f));
      g.lineTo(w - 8, y(top * f));
      g.stroke();
      g.fillText(String(Number((top * f).toFixed(1))), 4, y(top * f) + 4);
    }
    for (const [i, label] of [[0, "−5 min"], [done.length * 0.4, "−3 min"], [done.length * 0.8, "−1 min"], [done.length - 1, "now"]]) {
      g.fillText(label, Math.min(x(i), w - 30) - (i ? 14 : 0), h - 4);
    }
    g.fillStyle = color("--bar");
    const bw = Math.max(1, plotW / done.length - 0.5);
    done.forEach((v, i) => {
      if (v) g.fillRect(x(i) - bw / 2, y(v), bw, bottom - y(v));
    });
    g.strokeStyle = color("--accent");
    g.lineWidth = 2;
    g.beginPath();
    smooth.forEach((v, i) => (i ? g.lineTo(x(i), y(v)) : g.moveTo(x(i), y(v))));
    g.stroke();
  }

  // -- requests -------------------------------------------------------------------------
  function cell(field, value, format, extra) {
    const td = el("td", { className: format === "text" ? "" : "num", data: { field } });
    td.dataset.value = value == null ? "" : typeof value === "object" ? JSON.stringify(value) : String(value);
    td.textContent = format === "text" ? value : (fmt[format] || fmt.int)(value);
    if (extra) td.append(extra);
    return td;
  }

  function stateText(r) {
    if (r.state === "prefilling") return `prefilling ${r.prefill[0]}/${r.prefill[1]}`;
    if (r.state === "decoding") {
      const now = r.last_source == null ? "" : r.last_source === "plain" ? " · plain" : ` · b${r.last_block_size} ${r.last_source}`;
      return "decoding" + now;
    }
    if (r.state === "ok") return r.finish === "length" ? "done (max tokens)" : "done";
    return r.state;
  }

  function sourcesCell(r) {
    const by = r.tokens_by_source || {};
    const td = el("td", { className: "sources-cell" });
    const bar = el("div", { className: "bar small" });
    sourceBar(bar, SOURCES.map(([s]) => by[s] || 0));
    td.append(bar);
    const parts = el("span", { className: "parts" });
    SOURCES.forEach(([s, label], i) => {
      const n = el("span", { className: `num src ${s}`, text: String(by[s] || 0), title: label, data: { field: `tokens_by_source.${s}`, value: String(by[s] || 0) } });
      parts.append(i ? " / " : "", n);
    });
    td.append(parts);
    return td;
  }

  function sizesText(sizes) {
    const keys = Object.keys(sizes || {}).map(Number).sort((a, b) => a - b);
    return keys.length ? keys.map((k) => `b${k}×${sizes[k]}`).join(" ") : "–";
  }

  function renderRequests(requests) {
    const rows = [...requests.running, ...requests.recent].map((r) => {
      const tr = el("tr", { className: r.number != null && requests.running.includes(r) ? "running" : "", data: { requestId: r.id || "", state: r.state } });
      tr.append(
        el("td", { className: "req", title: r.id || "" }, el("span", { className: "endpoint", text: r.endpoint }), " ", el("span", { className: "id", text: r.id ? r.id.slice(-8) : `#${r.number}` })),
        el("td", { className: `state ${r.state}`, text: stateText(r) }),
        cell("prompt_tokens", r.prompt_tokens, "int"),
        cell("cached_tokens", r.cached_tokens, "int"),
        cell("completion_tokens", r.completion_tokens, "int"),
        cell("mean_tau", r.mean_tau, "f2"),
        sourcesCell(r),
        cell("block_sizes", r.block_sizes, "text"),
        cell("ttft_s", r.ttft_s, "ms"),
        cell("decode_tps", r.decode_tps, "f1")
      );
      tr.querySelector('[data-field="block_sizes"]').textContent = sizesText(r.block_sizes);
      return tr;
    });
    document.querySelector("#requests tbody").replaceChildren(...rows);
    $("no-requests").hidden = rows.length > 0;
  }

  function render(snap) {
    last = snap;
    renderServer(snap.server, snap.prompt_cache);
    renderMetrics(snap.metrics);
    renderDecoding(snap.decoding, snap.server);
    renderPlot(snap.tokens_per_second);
    renderRequests(snap.requests);
    document.body.dataset.version = String((Number(document.body.dataset.version) || 0) + 1);
  }

  function clear() {
    // the key was refused: nothing of an earlier snapshot stays on the page
    last = null;
    for (const node of document.querySelectorAll("[data-metric]")) show(node, null, "int");
    document.querySelector("#requests tbody").replaceChildren();
    for (const id of ["model", "s-model", "s-draft", "s-engine", "s-kernels", "s-device", "s-limits", "s-version", "s-uptime"]) $(id).textContent = "";
  }

  // -- the stream -----------------------------------------------------------------------
  async function follow() {
    let wait = 500;
    for (;;) {
      const controller = new AbortController();
      current = controller;
      let heard = Date.now();
      const watchdog = setInterval(() => {
        if (Date.now() - heard > STALE_MS) controller.abort();
      }, 1000);
      try {
        const r = await fetch("/ui/api/events", { headers: DF.headers(), cache: "no-store", signal: controller.signal });
        if (r.status === 401) {
          clearInterval(watchdog);
          clear();
          setConn("locked", "API key needed");
          await DF.askKey(DF.keyMessage());
          setConn("connecting", "connecting…");
          continue;
        }
        if (!r.ok) throw new Error(await DF.errorText(r));
        setConn("live", "live");
        wait = 500;
        for await (const ev of DF.sse(r)) {
          heard = Date.now();
          render(JSON.parse(ev.data));
        }
      } catch (e) {
        // the server is gone or restarting: keep what was shown, try again
      } finally {
        clearInterval(watchdog);
      }
      setConn("down", "reconnecting…");
      await DF.sleep(wait);
      wait = Math.min(wait * 2, 5000);
    }
  }

  window.addEventListener("resize", () => last && renderPlot(last.tokens_per_second));
  // leaving the page (or its going into the back-forward cache) closes the stream: a
  // frozen page would hold it open; back on the page, the loop above reconnects
  window.addEventListener("pagehide", () => current && current.abort());
  follow();
})();
