// The chat page: conversations in localStorage, replies streamed from /v1/chat/completions, each piece of text
// coloured by origin (the chunks' "edgespec" field), a live strip while it streams, a chart of the rounds after.
import { escapeHtml, render } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const STORE = "edgespec.conversations.v1";
const CURRENT = "edgespec.current";
const SETTINGS = "edgespec.settings";
const KEY = "edgespec.key"; // sessionStorage: the tab keeps it across reloads, nothing else sees it
const keyRequired = document.querySelector('meta[name="edgespec-key"]').content === "required";

// What tests (and the curious) can read: timings of the last reply.
const probe = (window.edgespecPage = { busy: false, replies: 0, ttft_ms: null, error: null, model: null });

let conversations = load(STORE, []);
let current = localStorage.getItem(CURRENT);
let model = null; // the card of /v1/models
let running = null; // {controller, reply}
const views = new WeakMap(); // message -> its elements (kept out of storage)

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v ?? fallback;
  } catch {
    return fallback;
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(conversations));
    localStorage.setItem(CURRENT, current ?? "");
  } catch (e) {
    status(`could not save the conversation in this browser: ${e.message}`);
  }
}

function status(text) {
  $("status").textContent = text;
}

function conversation() {
  let c = conversations.find((c) => c.id === current);
  if (!c) {
    c = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New chat",
      created: new Date().toISOString(), messages: [] };
    conversations.unshift(c);
    current = c.id;
  }
  return c;
}

// ----- the API key -------------------------------------------------------------------------------------------
function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

function askKey(message) {
  $("keymsg").textContent = message;
  $("keybox").hidden = false;
  $("key").focus();
}

$("keyform").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("keybox").hidden = true;
  connect();
});

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h.Authorization = `Bearer ${apiKey()}`;
  return h;
}

// A failed response's message, and whether it was about the key (then the key box asks again).
async function failure(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    /* not JSON */
  }
  const err = body && body.error ? body.error : { message: `HTTP ${res.status}` };
  if (res.status === 401) {
    const msg = err.code === "invalid_api_key"
      ? "The API key is wrong: the server refused it. Enter the key the server was started with."
      : "This server needs an API key (edgespec serve --api-key).";
    askKey(msg);
    return msg;
  }
  return err.message;
}

// ----- the model pair ----------------------------------------------------------------------------------------
async function connect(attempt = 0) {
  if (keyRequired && !apiKey()) {
    askKey("This server needs an API key.");
    return;
  }
  let res;
  try {
    res = await fetch("/v1/models", { headers: headers() });
  } catch (e) {
    $("pair").textContent = `cannot reach the server: ${e.message}`;
    return;
  }
  if (res.status === 503 && attempt < 120) { // still loading the models
    $("pair").textContent = "the server is loading its models…";
    setTimeout(() => connect(attempt + 1), 1000);
    return;
  }
  if (!res.ok) {
    $("pair").textContent = await failure(res);
    return;
  }
  model = (await res.json()).data[0];
  probe.model = model.id;
  const meta = model.meta || {};
  const where = (m) => `${escapeHtml(m.name)} <small>(${m.on_gpu ? "GPU" : "CPU"})</small>`;
  let pair = `target ${where(meta.target)}`;
  pair += meta.draft ? ` · draft ${where(meta.draft)}` : " · no draft model";
  pair += ` · lookup ${meta.lookup_available ? "available" : "off"} · draft_len ${escapeHtml(String(meta.draft_len))}`;
  $("pair").innerHTML = pair;
  if (!meta.lookup_available) $("lookup").disabled = true;
  status("");
}

// ----- settings ------------------------------------------------------------------------------------------------
const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];
const INTEGERS = new Set(["top_k", "max_tokens", "seed"]);

function restoreSettings() {
  const s = load(SETTINGS, {});
  for (const id of [...NUMBERS, "draft_mode", "draft_n", "lookup"]) if (s[id] !== undefined) $(id).value = s[id];
  syncDraftN();
}

function syncDraftN() {
  $("draft_n").disabled = $("draft_mode").value !== "n";
}

for (const id of [...NUMBERS, "draft_mode", "draft_n", "lookup"]) {
  $(id).addEventListener("change", () => {
    const s = {};
    for (const k of [...NUMBERS, "draft_mode", "draft_n", "lookup"]) s[k] = $(k).value;
    localStorage.setItem(SETTINGS, JSON.stringify(s));
    syncDraftN();
  });
}

function requestBody(messages) {
  const body = { model: model.id, messages, stream: true };
  for (const id of NUMBERS) {
    const v = $(id).value.trim();
    if (v !== "") body[id] = INTEGERS.has(id) ? parseInt(v, 10) : parseFloat(v);
  }
  const mode = $("draft_mode").value;
  if (mode === "auto") body.draft_len = "auto";
  else if (mode === "off") body.draft_len = 0;
  else if (mode === "n") body.draft_len = parseInt($("draft_n").value, 10) || 1;
  if ($("lookup").value && !$("lookup").disabled) body.lookup = $("lookup").value === "on";
  return body;
}

// ----- conversations ---------------------------------------------------------------------------------------------
function renderList() {
  const sel = $("convs");
  sel.innerHTML = "";
  for (const c of conversations) {
    const o = document.createElement("option");
    o.value = c.id;
    o.textContent = c.title;
    o.selected = c.id === current;
    sel.appendChild(o);
  }
}

function renderConversation() {
  const box = $("messages");
  box.innerHTML = "";
  const c = conversations.find((c) => c.id === current);
  if (c) for (const m of c.messages) box.appendChild(messageView(m));
  box.scrollTop = box.scrollHeight;
}

$("convs").addEventListener("change", () => {
  if (running) return;
  current = $("convs").value;
  save();
  renderConversation();
});

$("new").addEventListener("click", () => {
  if (running) stop();
  current = null;
  conversation();
  save();
  renderList();
  renderConversation();
  $("prompt").focus();
});

$("delete").addEventListener("click", () => {
  if (running) return;
  conversations = conversations.filter((c) => c.id !== current);
  current = conversations.length ? conversations[0].id : null;
  save();
  renderList();
  renderConversation();
});

$("export").addEventListener("click", () => {
  const c = conversations.find((c) => c.id === current);
  if (!c) return;
  const blob = new Blob([JSON.stringify({ ...c, model: model && model.id }, null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `edgespec-${c.id}.json`;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
});

// ----- one message -------------------------------------------------------------------------------------------
function messageView(m) {
  const el = document.createElement("article");
  el.className = `msg ${m.role}`;
  el.setAttribute("aria-label", m.role === "user" ? "you" : "assistant");
  const body = document.createElement("div");
  body.className = "body";
  el.appendChild(body);
  const foot = document.createElement("div");
  foot.className = "foot";
  el.appendChild(foot);
  views.set(m, { el, body, foot });
  paint(m);
  if (m.role === "assistant" && m.done) finishView(m);
  return el;
}

function paint(m) {
  const { body } = views.get(m);
  if (m.role === "user") body.textContent = m.content;
  else body.innerHTML = render(m.pieces || [{ text: m.content, origin: "target" }]);
}

function finishView(m) {
  const { foot } = views.get(m);
  foot.innerHTML = "";
  const s = m.speculation || {};
  const t = m.timings || {};
  const line = document.createElement("p");
  line.className = "summary";
  const parts = [];
  if (m.stopped) parts.push("stopped");
  if (m.error) parts.push(`error: ${m.error}`);
  if (t.predicted_n !== undefined) parts.push(`${t.predicted_n} tokens · ${fmt(t.predicted_per_second, 1)} tok/s`);
  if (s.drafted !== undefined) {
    parts.push(`acceptance ${pct(s.acceptance_rate)} (${s.accepted}/${s.drafted}) · ${fmt(s.tokens_per_verify, 2)} tokens/verify`);
    if (s.forced) parts.push(`${s.forced} tokens forced by the output's constraint (drafted for free)`);
    if (s.cache_drafted) parts.push(`from the prompt ${s.lookup_accepted}/${s.lookup_drafted}, from earlier replies ${s.cache_accepted}/${s.cache_drafted}`);
    if (!s.active && s.reason) parts.push(s.reason);
  }
  const sum = m.summary || {};
  if (sum.speedup) parts.push(`speedup ≈ ${fmt(sum.speedup, 2)}× vs plain decoding (${fmt(sum.plain_tokens_per_second, 1)} tok/s measured)`);
  else if (m.done && !m.stopped && !m.error) parts.push("speedup: unknown (the server measured no plain decode; draft_len auto does)");
  if (m.ttft_ms != null) parts.push(`first token ${fmt(m.ttft_ms, 0)} ms`);
  line.textContent = parts.join(" · ");
  foot.appendChild(line);
  if (m.rounds && m.rounds.length) foot.appendChild(chart(m.rounds));
}

const fmt = (x, d) => (typeof x === "number" ? x.toFixed(d) : "–");
const pct = (x) => (typeof x === "number" ? `${Math.round(x * 100)} %` : "–");

// Rounds over time: drafted (outlined) and accepted (filled) per round; x is the round's time.
function chart(rounds) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 600, H = 90, pad = 14;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H + pad}`);
  svg.setAttribute("class", "rounds");
  svg.setAttribute("role", "img");
  const total = rounds.reduce((a, r) => a + r[1], 0), acc = rounds.reduce((a, r) => a + r[2], 0);
  svg.setAttribute("aria-label", `${rounds.length} rounds: ${total} drafted tokens, ${acc} accepted`);
  const t0 = rounds[0][0], t1 = rounds[rounds.length - 1][0];
  const span = Math.max(t1 - t0, 1e-6);
  const top = Math.max(1, ...rounds.map((r) => r[1]));
  const bw = Math.max(1, Math.min(12, (W - 2) / rounds.length - 1));
  const add = (tag, attrs) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    svg.appendChild(e);
    return e;
  };
  add("line", { x1: 0, y1: H, x2: W, y2: H, class: "axis" });
  for (const [t, drafted, accepted, drafter] of rounds) {
    const x = rounds.length === 1 ? 1 : ((t - t0) / span) * (W - bw - 2) + 1;
    const hd = (drafted / top) * (H - 4), ha = (accepted / top) * (H - 4);
    if (drafted) add("rect", { x, y: H - hd, width: bw, height: hd, class: "drafted" });
    if (accepted) add("rect", { x, y: H - ha, width: bw, height: ha, class: `accepted ${drafter === "lookup" || drafter === "cache" ? drafter : "draft"}` });
    if (!drafted) add("rect", { x, y: H - 2, width: bw, height: 2, class: "plain" });
  }
  const label = add("text", { x: 0, y: H + pad - 2, class: "label" });
  label.textContent = `rounds over ${fmt(t1 - t0, 2)} s: drafted (outline) vs accepted (filled); flat = plain decode`;
  return svg;
}

// ----- the live strip ------------------------------------------------------------------------------------------
function strip(live) {
  $("strip").hidden = false;
  const set = (k, v) => { $("strip").querySelector(`[data-k="${k}"]`).textContent = v; };
  set("tps", fmt(live.tokens_per_second, 1));
  set("acc", pct(live.acceptance_rate));
  set("tpv", fmt(live.tokens_per_verify, 2));
  set("drafter", live.drafter);
  set("gamma", String(live.draft_len));
  set("why", live.decision || "–");
}

// ----- sending and streaming -------------------------------------------------------------------------------------
async function send() {
  const text = $("prompt").value;
  if (!text.trim() || running) return;
  if (!model) {
    status("not connected to the model yet");
    connect();
    return;
  }
  const c = conversation();
  const history = c.messages.filter((m) => !m.error).map((m) => ({ role: m.role, content: m.content }));
  const user = { role: "user", content: text };
  const reply = { role: "assistant", content: "", pieces: [], rounds: [], done: false };
  if (!c.messages.length) c.title = text.slice(0, 48);
  c.messages.push(user, reply);
  save();
  renderList();
  $("messages").appendChild(messageView(user));
  $("messages").appendChild(messageView(reply));
  $("prompt").value = "";
  const controller = new AbortController();
  running = { controller, reply };
  probe.busy = true;
  probe.ttft_ms = null;
  $("stop").disabled = false;
  $("send").disabled = true;
  status("generating…");
  const t0 = performance.now();
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody([...history, user])),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(await failure(res));
    await stream(res, reply, t0);
    status("");
  } catch (e) {
    if (e.name === "AbortError") {
      reply.stopped = true;
      status("stopped");
    } else {
      reply.error = e.message;
      probe.error = e.message;
      status(e.message);
    }
  } finally {
    reply.done = true;
    running = null;
    probe.busy = false;
    probe.replies += 1;
    $("stop").disabled = true;
    $("send").disabled = false;
    paint(reply);
    finishView(reply);
    save();
    $("prompt").focus();
  }
}

async function stream(res, reply, t0) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let pending = false;
  const box = $("messages");
  const repaint = () => {
    pending = false;
    paint(reply);
    box.scrollTop = box.scrollHeight;
  };
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    let grew = false;
    for (const event of events) {
      for (const line of event.split(/\r?\n/)) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        grew = take(chunk, reply) || grew;
      }
    }
    if (grew && reply.ttft_ms == null) { // the first text: into the DOM now, and timed
      repaint();
      reply.ttft_ms = probe.ttft_ms = performance.now() - t0;
    } else if (grew && !pending) {
      pending = true;
      requestAnimationFrame(repaint);
    }
  }
}

// One chunk into the reply; whether it added text.
function take(chunk, reply) {
  const ext = chunk.edgespec;
  let grew = false;
  if (ext) {
    for (const s of ext.spans) {
      const last = reply.pieces[reply.pieces.length - 1];
      if (last && last.origin === s.origin) last.text += s.text;
      else reply.pieces.push({ text: s.text, origin: s.origin });
      reply.content += s.text;
      grew = grew || s.text.length > 0;
    }
    for (const r of ext.rounds) reply.rounds.push([r.t, r.drafted, r.accepted, r.drafter]);
    if (ext.live) strip(ext.live);
    if (ext.summary) reply.summary = ext.summary;
  } else { // a server without the extension: plain text
    const choice = chunk.choices && chunk.choices[0];
    const text = choice && choice.delta && choice.delta.content;
    if (text) {
      reply.content += text;
      reply.pieces.push({ text, origin: "target" });
      grew = true;
    }
  }
  if (chunk.timings) reply.timings = chunk.timings;
  if (chunk.speculation) reply.speculation = chunk.speculation;
  return grew;
}

function stop() {
  if (running) running.controller.abort();
}

// ----- keyboard ------------------------------------------------------------------------------------------------
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("stop").addEventListener("click", stop);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && running) {
    e.preventDefault();
    stop();
  }
});

// ----- start -----------------------------------------------------------------------------------------------------
restoreSettings();
if (!conversations.find((c) => c.id === current)) current = conversations.length ? conversations[0].id : null;
renderList();
renderConversation();
connect();
$("prompt").focus();
