// The chat: the server's own /v1/chat/completions, streamed, the answer rendered as
// Markdown (DF.markdown: text nodes only) and, under it, the terminal chat's engine
// line from the answer's usage and x_dflash.
"use strict";

(() => {
  const { el } = DF;
  const $ = (id) => document.getElementById(id);
  const FIELDS = ["system", "temperature", "top_p", "top_k", "max_tokens"];
  const STORE = "dflash-mlx-chat-settings";
  let server = null; // the snapshot's server part: model, mode, block size
  let history = []; // [{role, content}] of this conversation
  let controller = null; // the answer in flight

  function setConn(state, text) {
    $("conn").dataset.state = state;
    $("conn").textContent = text;
  }

  // -- settings, kept in this browser ------------------------------------------------
  function loadSettings() {
    try {
      const saved = JSON.parse(localStorage.getItem(STORE) || "{}");
      for (const f of FIELDS) if (typeof saved[f] === "string") $(f).value = saved[f];
    } catch (e) {
      // nothing kept
    }
  }

  function saveSettings() {
    try {
      localStorage.setItem(STORE, JSON.stringify(Object.fromEntries(FIELDS.map((f) => [f, $(f).value]))));
    } catch (e) {
      // storage off
    }
  }

  function requestBody() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    const body = {
      model: server ? server.model : "default",
      messages: messages.concat(history),
      stream: true,
      stream_options: { include_usage: true },
    };
    for (const f of ["temperature", "top_p", "top_k", "max_tokens"]) {
      const v = $(f).value.trim();
      if (v !== "" && !Number.isNaN(Number(v))) body[f] = Number(v);
    }
    return body;
  }

  // -- the server ---------------------------------------------------------------------
  async function connect() {
    for (let wait = 500; ; wait = Math.min(wait * 2, 5000)) {
      try {
        const snap = await DF.getJSON("/ui/api/snapshot");
        server = snap.server;
        $("model").textContent = server.model + (server.draft ? "  +  " + server.draft : "");
        setConn("live", DF.modeLabel(server.mode, server.block_size));
        return;
      } catch (e) {
        if (e instanceof DF.Unauthorized) {
          setConn("locked", "API key needed");
          await DF.askKey(DF.keyMessage());
          wait = 250;
          continue;
        }
        setConn("down", "server unreachable, retrying…");
        await DF.sleep(wait);
      }
    }
  }

  // -- messages -----------------------------------------------------------------------
  function nearBottom() {
    const doc = document.scrollingElement;
    return doc.scrollHeight - doc.scrollTop - doc.clientHeight < 80;
  }

  function scroll(follow) {
    if (follow) window.scrollTo(0, document.scrollingElement.scrollHeight);
  }

  function addMessage(role) {
    $("empty").hidden = true;
    const body = el("div", { className: "body" });
    const root = el("article", { className: `msg ${role}` }, el("div", { className: "role", text: role === "user" ? "you" : "model" }), body);
    $("messages").append(root);
    return { root, body };
  }

  function renderAnswer(turn, answer, reasoning) {
    const parts = [];
    if (reasoning) {
      parts.push(el("details", { className: "reasoning" }, el("summary", { text: "thinking" }), el("div", { className: "plain-text", text: reasoning })));
    }
    parts.push(DF.markdown(answer));
    turn.body.replaceChildren(...parts);
  }

  function busy(on) {
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("input").disabled = false;
  }

  async function send(text) {
    const user = addMessage("user");
    user.body.append(el("div", { className: "plain-text", text }));
    history.push({ role: "user", content: text });
    const turn = addMessage("assistant");
    turn.root.classList.add("streaming");
    scroll(true);
    const body = requestBody();
    controller = new AbortController();
    busy(true);
    let answer = "";
    let reasoning = "";
    let x = null;
    let usage = null;
    let finish = null;
    let error = null;
    let pending = null; // a render waiting (at most one every 50 ms)
    const later = () => {
      if (pending) return;
      pending = setTimeout(() => {
        pending = null;
        const stay = nearBottom();
        renderAnswer(turn, answer, reasoning);
        scroll(stay);
      }, 50);
    };
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: DF.headers({ "Content-Type": "application/json" }),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (r.status === 401) {
        history.pop();
        user.root.remove();
        turn.root.remove();
        $("input").value = text;
        controller = null;
        busy(false);
        setConn("locked", "API key needed");
        await DF.askKey(DF.keyMessage());
        await connect();
        return;
      }
      if (!r.ok) throw new Error(await DF.errorText(r));
      for await (const ev of DF.sse(r)) {
        if (ev.data === "[DONE]") break;
        const chunk = JSON.parse(ev.data);
        if (chunk.error) throw new Error(chunk.error.message || "generation failed");
        if (chunk.usage) usage = chunk.usage;
        if (chunk.x_dflash) x = chunk.x_dflash;
        const choice = (chunk.choices || [])[0];
        if (!choice) continue;
        if (choice.finish_reason) finish = choice.finish_reason;
        const d = choice.delta || {};
        if (d.reasoning_content) reasoning += d.reasoning_content;
        if (d.content) answer += d.content;
        if (d.content || d.reasoning_content) later();
      }
    } catch (e) {
      if (e.name === "AbortError") finish = "interrupted";
      else error = e.message || String(e);
    } finally {
      if (pending) clearTimeout(pending);
      controller = null;
      busy(false);
    }
    const stay = nearBottom();
    renderAnswer(turn, answer, reasoning);
    turn.root.classList.remove("streaming");
    if (error) history.pop(); // no answer: the question is not kept
    else history.push({ role: "assistant", content: answer });
    let line;
    if (error) {
      line = el("div", { className: "engine error", text: `error: ${error}` });
    } else if (x && usage && server) {
      const stats = DF.turnStats(server.mode, server.block_size, usage, x, finish === "length" ? "length" : finish);
      line = el("div", { className: "engine", text: DF.summaryLine(stats) });
      line.dataset.x = JSON.stringify({ usage, x_dflash: x });
    } else {
      line = el("div", { className: "engine", text: finish === "interrupted" ? "interrupted" : "" });
    }
    turn.root.append(line);
    scroll(stay);
  }

  function newConversation() {
    if (controller) controller.abort();
    history = [];
    for (const node of [...$("messages").querySelectorAll(".msg")]) node.remove();
    $("empty").hidden = false;
    $("input").focus();
  }

  // -- wiring -----------------------------------------------------------------------------
  loadSettings();
  for (const f of FIELDS) $(f).addEventListener("change", saveSettings);
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("new").addEventListener("click", newConversation);
  connect();
})();
