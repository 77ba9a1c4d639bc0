#include "server/chat_page.h"

#include <string>

namespace strata::server {

namespace {

// The markup and style; the scripts follow it (chat_page_html).
constexpr std::string_view kPage = R"page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>strata chat</title>
<style>
  :root { color-scheme: light dark; --line: #8884; --accent: #2f6fdf; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, sans-serif; display: flex; flex-direction: column;
         height: 100vh; }
  header { display: flex; gap: .75rem; align-items: center; padding: .5rem 1rem;
           border-bottom: 1px solid var(--line); flex-wrap: wrap; }
  header h1 { font-size: 1rem; margin: 0; }
  header label { font-size: .85rem; display: flex; gap: .3rem; align-items: center; }
  header input { width: 5rem; }
  #system { width: 100%; min-height: 2.2rem; resize: vertical; font: inherit; }
  #settings { padding: .5rem 1rem; border-bottom: 1px solid var(--line); }
  #body { flex: 1; display: flex; min-height: 0; }
  #messages { flex: 1; overflow-y: auto; padding: 1rem; display: flex; flex-direction: column;
              gap: .75rem; }
  #cache { width: 22rem; padding: .75rem 1rem; border-left: 1px solid var(--line); overflow-y: auto;
           font-size: .8rem; }
  #cache h2 { font-size: .9rem; margin: 0 0 .4rem; }
  #cache canvas { width: 100%; display: block; margin: .4rem 0; image-rendering: pixelated; }
  #cache .legend { opacity: .7; }
  #cache .legend b { font-weight: normal; padding: 0 .3rem; border-radius: .2rem; }
  @media (max-width: 50rem) { #body { flex-direction: column; } #cache { width: auto; border-left: 0;
                              border-top: 1px solid var(--line); } }
  .msg { max-width: 52rem; white-space: pre-wrap; word-wrap: break-word; padding: .5rem .75rem;
         border-radius: .5rem; border: 1px solid var(--line); }
  .user { align-self: flex-end; background: #2f6fdf22; }
  .assistant { align-self: flex-start; }
  .error { align-self: center; color: #d33; border-color: #d33; }
  .meta, .telemetry { font-size: .75rem; opacity: .65; margin-top: .25rem; }
  details.thinking { font-size: .85rem; opacity: .75; margin-bottom: .35rem; }
  details.thinking summary { cursor: pointer; }
  details.thinking .thought { border-left: 2px solid var(--line); padding-left: .5rem; }
  form { display: flex; gap: .5rem; padding: .75rem 1rem; border-top: 1px solid var(--line); }
  #input { flex: 1; min-height: 2.6rem; max-height: 12rem; resize: vertical; font: inherit; }
  button { font: inherit; padding: .3rem .9rem; }
  #send { background: var(--accent); color: white; border: 0; border-radius: .3rem; }
</style>
</head>
<body>
<header>
  <h1>strata</h1><span id="model">…</span>
  <label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>max tokens <input id="max_tokens" type="number" min="1" step="1" value="512"></label>
  <label>API key <input id="api_key" type="password" placeholder="none"></label>
  <button id="clear" type="button">New chat</button>
</header>
<div id="settings">
  <textarea id="system" placeholder="System prompt (optional)"></textarea>
</div>
<div id="body">
<main id="messages" aria-live="polite"></main>
<aside id="cache" aria-label="expert cache">
  <h2>Expert cache</h2>
  <div id="cache-summary">…</div>
  <div id="cache-live">
  <canvas id="cache-chart" width="320" height="110"></canvas>
  <div class="legend"><b style="color:#2a9d5c">━ hit rate (0-100%)</b><b style="color:#2f6fdf">━ read GB/s</b>
    per second, last 2 minutes</div>
  <canvas id="cache-heat" width="320" height="120"></canvas>
  <div class="legend" id="cache-heat-legend">which experts hold a cache slot: a row per layer, a column per expert</div>
  </div>
</aside>
</div>
<form id="form">
  <textarea id="input" placeholder="Message (Enter sends, Shift+Enter for a new line)" autofocus></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" disabled>Stop</button>
</form>
<script>
"use strict";
)page";

// The chat: streaming replies, the conversation, each reply's telemetry.
constexpr std::string_view kChatScript = R"script(const $ = (id) => document.getElementById(id);
const turns = [];
let controller = null;
let modelId = "";

const keyField = $("api_key");
keyField.value = localStorage.getItem("strata_api_key") || "";
keyField.addEventListener("change", () => localStorage.setItem("strata_api_key", keyField.value));

function headers() {
  const h = { "Content-Type": "application/json" };
  if (keyField.value) h["Authorization"] = "Bearer " + keyField.value;
  return h;
}

function bubble(kind, text) {
  const div = document.createElement("div");
  div.className = "msg " + kind;
  div.textContent = text;
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const body = await r.json();
    modelId = body.data[0].id;
    $("model").textContent = modelId;
  } catch (e) {
    $("model").textContent = "(no model: " + e + ")";
  }
}

// Yields the JSON payload of each `data:` event of a Server-Sent Events stream; comment lines
// (": keep-alive") and the final "[DONE]" are skipped.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data !== "[DONE]") yield JSON.parse(data);
      }
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

// The model's reasoning goes into a collapsed "Thinking" box above the answer, created when the
// first reasoning_content delta arrives; it is not sent back in later turns.
function thinkingBox(out) {
  let box = out.querySelector("details.thinking .thought");
  if (!box) {
    const details = document.createElement("details");
    details.className = "thinking";
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    box = document.createElement("div");
    box.className = "thought";
    details.append(summary, box);
    out.prepend(details);
  }
  return box;
}

// How the reply was made (the server's `timings`, llama-server's names plus the expert cache's):
// "prefill 812 tok/s · decode 23.4 tok/s · expert hit 95.1% · 1.20 GB/s read · stall 2.1 ms/tok ·
// drafts 40 of 52 accepted"; what the server did not measure is left out.
function telemetryLine(t) {
  const parts = [];
  if (t.prompt_per_second !== undefined) parts.push("prefill " + t.prompt_per_second.toFixed(1) + " tok/s");
  if (t.predicted_per_second !== undefined) parts.push("decode " + t.predicted_per_second.toFixed(1) + " tok/s");
  if (t.expert_hit_rate !== undefined) parts.push("expert hit " + (100 * t.expert_hit_rate).toFixed(1) + "%");
  if (t.ssd_gb_per_s !== undefined) parts.push(t.ssd_gb_per_s.toFixed(2) + " GB/s read");
  if (t.stall_ms_per_token !== undefined) parts.push("stall " + t.stall_ms_per_token.toFixed(1) + " ms/tok");
  if (t.draft_n !== undefined) parts.push("drafts " + t.draft_n_accepted + " of " + t.draft_n + " accepted");
  const div = document.createElement("div");
  div.className = "telemetry";
  div.textContent = parts.join(" · ");
  div.dataset.timings = JSON.stringify(t);
  return div;
}

async function send(text) {
  turns.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  const answer = document.createElement("span");
  answer.className = "answer";
  out.appendChild(answer);
  let thought = "";
  const meta = document.createElement("div");
  meta.className = "meta";
  let timings = null;
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...turns);
  const request = {
    model: modelId, messages, stream: true, stream_options: { include_usage: true },
    temperature: Number($("temperature").value), max_tokens: Number($("max_tokens").value),
  };
  controller = new AbortController();
  setBusy(true);
  let reply = "";
  const started = performance.now();
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(request),
      signal: controller.signal,
    });
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || r.status + " " + r.statusText);
    }
    for await (const chunk of events(r)) {
      if (chunk.error) throw new Error(chunk.error.message);
      const choice = chunk.choices[0];
      if (choice && choice.delta && choice.delta.reasoning_content) {
        thought += choice.delta.reasoning_content;
        thinkingBox(out).textContent = thought;
      }
      if (choice && choice.delta && choice.delta.content) {
        reply += choice.delta.content;
        answer.textContent = reply;
        out.scrollIntoView({ block: "end" });
      }
      if (chunk.timings) timings = chunk.timings;
      if (chunk.usage) {
        const s = (performance.now() - started) / 1000;
        meta.textContent = chunk.usage.completion_tokens + " tokens, " + s.toFixed(1) + " s, " +
          chunk.usage.prompt_tokens_details.cached_tokens + " of " + chunk.usage.prompt_tokens +
          " prompt tokens cached";
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") bubble("error", String(e.message || e));
  } finally {
    turns.push({ role: "assistant", content: reply });
    out.appendChild(meta);
    if (timings) out.appendChild(telemetryLine(timings));
    controller = null;
    setBusy(false);
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("form").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  turns.length = 0;
  $("messages").replaceChildren();
});
loadModel();
)script";

}  // namespace

std::string_view chat_page_html() {
  static const std::string page =
      std::string(kPage) + std::string(kChatScript) + std::string(cache_panel_script()) + "</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace strata::server
