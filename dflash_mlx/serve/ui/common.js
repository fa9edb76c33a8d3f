// dflash-mlx's own pages: what the dashboard and the chat share. The pages hold no
// data: it comes from the server's API, with the key the user types when the server
// has one (--api-key). Text from the model or the user enters the page as text nodes
// only (no innerHTML anywhere), so an answer holding <script> shows as text.
"use strict";

const DF = (() => {
  const KEY = "dflash-mlx-api-key"; // this tab's only (sessionStorage)

  function getKey() {
    try {
      return sessionStorage.getItem(KEY) || "";
    } catch (e) {
      return "";
    }
  }

  function setKey(key) {
    try {
      if (key) sessionStorage.setItem(KEY, key);
      else sessionStorage.removeItem(KEY);
    } catch (e) {
      // storage off: the key lasts until the page reloads
    }
  }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = getKey();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  class Unauthorized extends Error {}

  async function errorText(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || `${response.status} ${response.statusText}`;
    } catch (e) {
      return `${response.status} ${response.statusText}`;
    }
  }

  async function getJSON(path, signal) {
    const r = await fetch(path, { headers: headers(), cache: "no-store", signal });
    if (r.status === 401) throw new Unauthorized("unauthorized");
    if (!r.ok) throw new Error(await errorText(r));
    return r.json();
  }

  // el("td", {className: "num", text: "3", data: {field: "mean_tau"}}, child, ...):
  // an element; strings among the children become text nodes
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "className") node.className = v;
      else if (k === "data") Object.assign(node.dataset, v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  // The server-sent events of a fetch response, as {event, data}: fetch (not
  // EventSource) so that the key goes in a header.
  async function* sse(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let event = null;
          const data = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
            else if (line.startsWith("event:")) event = line.slice(6).trim();
          }
          if (data.length) yield { event, data: data.join("\n") };
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // -- the key ------------------------------------------------------------------
  function keyMessage() {
    return getKey()
      ? "The server did not accept this key. Type the key it was started with (--api-key)."
      : "This server needs its API key (--api-key). Type it to continue.";
  }

  // Shows the key form (the page's data hidden) until a key is typed.
  function askKey(message) {
    const gate = document.getElementById("key-gate");
    const form = document.getElementById("key-form");
    const input = document.getElementById("key-input");
    document.getElementById("key-message").textContent = message || keyMessage();
    document.body.classList.add("locked");
    gate.hidden = false;
    input.focus();
    return new Promise((resolve) => {
      form.onsubmit = (e) => {
        e.preventDefault();
        const key = input.value.trim();
        if (!key) return;
        setKey(key);
        input.value = "";
        gate.hidden = true;
        document.body.classList.remove("locked");
        resolve();
      };
    });
  }

  // -- numbers --------------------------------------------------------------------
  const dash = "–";
  const fmt = {
    int: (v) => (v == null ? dash : Math.round(v).toLocaleString("en-US")),
    f1: (v) => (v == null ? dash : Number(v).toFixed(1)),
    f2: (v) => (v == null ? dash : Number(v).toFixed(2)),
    pct: (v) => (v == null ? dash : (100 * v).toFixed(0) + "%"),
    ms: (v) => (v == null ? dash : (1000 * v).toFixed(0) + " ms"),
    bytes: (v) => {
      if (v == null) return dash;
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let x = Number(v);
      let i = 0;
      while (Math.abs(x) >= 1024 && i < units.length - 1) {
        x /= 1024;
        i += 1;
      }
      return (i ? x.toFixed(x < 10 ? 2 : x < 100 ? 1 : 0) : String(Math.round(x))) + " " + units[i];
    },
    duration: (s) => {
      if (s == null) return dash;
      s = Math.floor(s);
      const d = Math.floor(s / 86400);
      const h = Math.floor((s % 86400) / 3600);
      const m = Math.floor((s % 3600) / 60);
      if (d) return `${d} d ${h} h`;
      if (h) return `${h} h ${m} min`;
      if (m) return `${m} min ${s % 60} s`;
      return `${s} s`;
    },
  };

  // -- the engine line: the terminal chat's wording (cli/ui.py) ----------------------
  const SPECULATING = ["dflash", "lookup"];

  function modeLabel(mode, blockSize) {
    if (mode === "lookup") return "plain + lookup";
    if (mode !== "dflash") return "plain";
    return blockSize === "auto" ? "DFlash auto" : `DFlash b${blockSize}`;
  }

  // One answer's numbers, from its `usage` and `x_dflash` (the terminal's TurnStats).
  function turnStats(mode, blockSize, usage, x, finish) {
    const sizes = {};
    for (const [k, v] of Object.entries(x.block_sizes || {})) sizes[Number(k)] = v;
    const sources = {};
    for (const [k, v] of Object.entries(x.blocks_by_source || {})) {
      if (k !== "plain") sources[k] = v;
    }
    const details = usage.prompt_tokens_details || {};
    return {
      mode,
      blockSize,
      promptTokens: usage.prompt_tokens,
      reusedTokens: details.cached_tokens || 0,
      promptTps: x.prompt_tps || 0,
      ttft: x.ttft_s,
      generationTokens: usage.completion_tokens,
      generationTps: x.decode_tps || 0,
      blocks: x.verify_steps || 0,
      draftedBlocks: Object.values(sources).reduce((a, b) => a + b, 0),
      sizes,
      sources,
      meanAccepted: x.mean_tau,
      finish: finish || null,
    };
  }

  function drafted(s) {
    return `${s.draftedBlocks}/${s.blocks} blocks ${s.mode === "lookup" ? "copied" : "drafted"}`;
  }

  function draftedDetail(s) {
    const sizes = Object.keys(s.sizes)
      .map(Number)
      .filter((n) => n > 1)
      .sort((a, b) => a - b);
    const parts = [];
    if (sizes.length) {
      const low = sizes[0];
      const high = sizes[sizes.length - 1];
      parts.push(low === high ? `b${low}` : `b${low}–b${high}`);
    }
    const names = Object.keys(s.sources).sort();
    if (names.some((k) => k !== "draft")) {
      parts.push(names.map((k) => `${k} ${s.sources[k]}`).join(", "));
    }
    return parts.length ? ` (${parts.join("; ")})` : "";
  }

  function engineSummary(s) {
    const label = modeLabel(s.mode, s.blockSize);
    if (!SPECULATING.includes(s.mode) || !s.blocks) return label;
    const text = `${label}: ${drafted(s)}${draftedDetail(s)}`;
    if (!s.draftedBlocks) return text + ", all plain";
    const plain = s.blocks - s.draftedBlocks;
    return text + (plain ? `, ${plain} plain` : "");
  }

  // The line under an answer: the terminal's summary line, memory aside.
  function summaryLine(s) {
    const cached = s.reusedTokens ? `, ${s.reusedTokens} cached` : "";
    const ttft = s.ttft == null ? dash : (s.ttft * 1000).toFixed(0);
    let t =
      `prompt ${s.promptTokens} tok${cached} @ ${s.promptTps.toFixed(0)} tok/s` +
      ` · TTFT ${ttft} ms · gen ${s.generationTokens} tok @ ${s.generationTps.toFixed(1)} tok/s` +
      ` · ${engineSummary(s)}`;
    if (SPECULATING.includes(s.mode)) t += ` · τ ${fmt.f2(s.meanAccepted)}`;
    if (s.finish === "interrupted") t += " · interrupted";
    else if (s.finish === "length") t += " · hit max tokens";
    return t;
  }

  // -- Markdown, safely: the text is split into blocks and spans, each put in the page
  // as a text node (code fences, inline code, bold, italics, headings, lists, quotes,
  // paragraphs); an unclosed fence (an answer still streaming) runs to the end.
  function inline(text) {
    const out = [];
    const pattern = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^\s*](?:[\s\S]*?[^\s])?)\*\*|__([^\s_](?:[\s\S]*?[^\s])?)__|\*([^\s*](?:[^*]*?[^\s*])?)\*|\n/g;
    let last = 0;
    let m;
    while ((m = pattern.exec(text)) !== null) {
      if (m.index > last) out.push(document.createTextNode(text.slice(last, m.index)));
      if (m[0] === "\n") out.push(el("br"));
      else if (m[1]) out.push(el("code", { text: m[2] }));
      else if (m[3] !== undefined) out.push(el("strong", {}, ...inline(m[3])));
      else if (m[4] !== undefined) out.push(el("strong", {}, ...inline(m[4])));
      else out.push(el("em", {}, ...inline(m[5])));
      last = pattern.lastIndex;
    }
    if (last < text.length) out.push(document.createTextNode(text.slice(last)));
    return out;
  }

  function markdown(text) {
    const root = document.createDocumentFragment();
    const lines = text.split("\n");
    let para = [];
    let list = null;
    const flush = () => {
      if (para.length) root.append(el("p", {}, ...inline(para.join("\n"))));
      para = [];
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*(`{3,}|~{3,})\s*([^`\s]*)/);
      const item = line.match(/^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/);
      if (!item) list = null;
      if (fence) {
        flush();
        const code = [];
        for (i += 1; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) {
          code.push(lines[i]);
        }
        const c = el("code", { text: code.join("\n") });
        if (fence[2]) c.dataset.lang = fence[2];
        root.append(el("pre", { className: "code" }, fence[2] ? el("span", { className: "lang", text: fence[2] }) : null, c));
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      if (heading) {
        flush();
        root.append(el(`h${Math.min(heading[1].length + 2, 6)}`, {}, ...inline(heading[2])));
      } else if (item) {
        flush();
        const ordered = /\d/.test(item[1]);
        if (!list || list.ordered !== ordered) {
          list = { ordered, node: el(ordered ? "ol" : "ul") };
          root.append(list.node);
        }
        list.node.append(el("li", {}, ...inline(item[2])));
      } else if (/^\s*>/.test(line)) {
        flush();
        root.append(el("blockquote", {}, ...inline(line.replace(/^\s*>\s?/, ""))));
      } else if (!line.trim()) {
        flush();
      } else {
        para.push(line);
      }
    }
    flush();
    return root;
  }

  return {
    getKey,
    setKey,
    headers,
    Unauthorized,
    errorText,
    getJSON,
    el,
    sse,
    sleep,
    keyMessage,
    askKey,
    fmt,
    modeLabel,
    turnStats,
    engineSummary,
    summaryLine,
    markdown,
  };
})();
