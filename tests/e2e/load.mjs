// A bounded load test of `strata serve --queue 2` with plain fetch (no extra packages). Each round
// holds the one generation slot with a long streamed completion, then fires CLIENTS concurrent
// chat requests: exactly QUEUE of them wait and complete (streamed or not), the others get 429
// with Retry-After and an OpenAI rate-limit body; then the holder hangs up, which cancels its
// generation. Between rounds the server must be alive and healthy. Its resident memory after the
// warm-up rounds bounds the rest: growth past RSS_GROWTH_FRACTION + RSS_GROWTH_SLACK fails.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { endTokenIds, parseMetrics, rssBytes, startServer, synthModel, waitFor, watchdog } from "./harness.mjs";

watchdog(150);

const QUEUE = 2;
// At most the server's HTTP threads less the holder's (it has QUEUE + 9): a keep-alive client
// past that waits for a thread, for up to httplib's keep-alive timeout, before even its 429.
const CLIENTS = 10;
const WARMUP_ROUNDS = 4;
const ROUNDS = 20;
const RSS_GROWTH_FRACTION = 0.10;
const RSS_GROWTH_SLACK = 4 << 20;
const MiB = (bytes) => (bytes / (1 << 20)).toFixed(1);

let server;
let holderBody;

before(async () => {
  const model = synthModel("load");
  server = await startServer(model, ["--queue", String(QUEUE), "--ctx", "4096"]);
  // The holder must not end by itself: its end tokens are banned and max_tokens is far more
  // than a round takes.
  const logitBias = Object.fromEntries(endTokenIds(model).map((id) => [String(id), -100]));
  holderBody = JSON.stringify({ model: server.modelId, prompt: "hold the slot", max_tokens: 4080,
    temperature: 1, seed: 1, stream: true, logit_bias: logitBias });
});

after(async () => {
  if (server) assert.equal(await server.stop(), 0, "strata serve did not exit 0 on SIGTERM");
});

function post(path, body, signal) {
  return fetch(`${server.url}${path}`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body), signal });
}

// Starts the long completion and returns once it streams (so it owns the generation slot).
async function startHolder() {
  const controller = new AbortController();
  const response = await fetch(`${server.url}/v1/completions`, { method: "POST", body: holderBody,
    headers: { "Content-Type": "application/json" }, signal: controller.signal });
  assert.equal(response.status, 200);
  const reader = response.body.getReader();
  let text = "";
  while (!text.includes("data: {")) {
    const { value, done } = await reader.read();
    assert.ok(!done, "the holder's stream ended before its first chunk");
    text += new TextDecoder().decode(value);
  }
  return { stop: () => controller.abort(), reader };
}

// One client: a chat request, streamed for odd `i`. Resolves to {status, retryAfter, body} once
// the whole response is in.
async function client(i) {
  const stream = i % 2 === 1;
  const response = await post("/v1/chat/completions", { model: server.modelId, max_tokens: 16, seed: i, stream,
    messages: [{ role: "user", content: `client ${i} says hello` }] });
  return { status: response.status, retryAfter: response.headers.get("retry-after"), stream, body: await response.text() };
}

function checkCompleted(result) {
  if (result.stream) {
    assert.ok(result.body.trimEnd().endsWith("data: [DONE]"), `a queued stream did not end with [DONE]: ${result.body.slice(-200)}`);
    assert.ok(!result.body.includes('"error"'), result.body.slice(-300));
  } else {
    const body = JSON.parse(result.body);
    assert.equal(body.object, "chat.completion");
    assert.ok(body.usage.completion_tokens >= 1 && body.usage.completion_tokens <= 16);
  }
}

function checkRejected(result) {
  assert.match(result.retryAfter ?? "", /^[1-9]\d*$/, "a 429 without a positive Retry-After");
  const { error } = JSON.parse(result.body);
  assert.equal(error.type, "rate_limit_error");
  assert.equal(error.code, "queue_full");
  assert.equal(typeof error.message, "string");
}

async function round() {
  const holder = await startHolder();
  let rejected = 0;
  const clients = Array.from({ length: CLIENTS }, (_, i) =>
    client(i).then((r) => {
      if (r.status === 429) ++rejected;
      return r;
    }));
  try {
    // The holder still runs, so the queue takes exactly QUEUE and turns the rest away at once.
    await waitFor(`${CLIENTS - QUEUE} answers of 429`, 30, async () => rejected >= CLIENTS - QUEUE);
    const metrics = parseMetrics(await (await fetch(`${server.url}/metrics`)).text());
    assert.equal(metrics.strata_generation_running, 1, "the holder ended before the burst was admitted");
    assert.equal(metrics.strata_queue_depth, QUEUE);
  } finally {
    holder.stop();
  }
  const results = await Promise.all(clients);
  const statuses = results.map((r) => r.status);
  assert.equal(statuses.filter((s) => s === 429).length, CLIENTS - QUEUE, `statuses ${statuses}`);
  assert.equal(statuses.filter((s) => s === 200).length, QUEUE, `statuses ${statuses}`);
  for (const r of results) (r.status === 429 ? checkRejected : checkCompleted)(r);
  assert.ok(server.alive(), "strata serve died");
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
}

test(`${ROUNDS} rounds of ${CLIENTS} clients against --queue ${QUEUE}: 429s, completions, bounded RSS`, async (t) => {
  let warm = 0;
  const rss = [];
  for (let i = 0; i < ROUNDS; ++i) {
    await round();
    // The cancelled holder is gone once the server reports nothing running.
    await waitFor("the server to go idle", 30, async () =>
      parseMetrics(await (await fetch(`${server.url}/metrics`)).text()).strata_generation_running === 0);
    rss.push(rssBytes(server.pid));
    if (i === WARMUP_ROUNDS - 1) warm = rss.at(-1);
  }
  t.diagnostic(`RSS after each round (MiB): ${rss.map(MiB).join(" ")}`);
  const limit = warm * (1 + RSS_GROWTH_FRACTION) + RSS_GROWTH_SLACK;
  const peak = Math.max(...rss.slice(WARMUP_ROUNDS));
  assert.ok(peak <= limit, `RSS grew from ${MiB(warm)} MiB after warm-up to ${MiB(peak)} MiB (bound ${MiB(limit)} MiB)`);

  const metrics = parseMetrics(await (await fetch(`${server.url}/metrics`)).text());
  assert.equal(metrics.strata_rejected_total, ROUNDS * (CLIENTS - QUEUE));
  assert.ok(metrics['strata_generations_total{finish_reason="cancelled"}'] >= ROUNDS, "the holders' generations were not cancelled");
  assert.equal(metrics.strata_queue_depth, 0);
});
