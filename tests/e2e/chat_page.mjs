// The chat page at / in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core):
// it loads and names the model, a sent message gets a streamed reply that grows on screen and
// equals the API's reply for the same greedy request, a second turn is served from the prompt
// cache, and Stop ends a long reply mid-stream, which the server counts as a cancelled
// generation; with a template that opens <think>, the reasoning streams into a collapsed
// "Thinking" box, apart from the answer. Under each reply its telemetry (the server's `timings`);
// beside the chat the live expert-cache panel, which with experts streamed through a small cache
// draws the hit rate and read rate over time and a layer-by-expert residency map that equal what
// GET /expert-cache says. On failure a screenshot goes to --out.
import assert from "node:assert/strict";
import path from "node:path";
import { after, before, test } from "node:test";

import { chatTemplate, outDir, requirePackage, startServer, strata, synthModel, waitFor, watchdog } from "./harness.mjs";

watchdog(150);
const { chromium } = requirePackage("playwright-core");

let server;
let thinker;
let streamed;
let browser;
let page;
let model;

before(async () => {
  // A wider, deeper model than the other tests' (about 200 tok/s here instead of 2000), so a
  // long reply is still streaming when the test presses Stop.
  model = synthModel("page", ["--hidden", "1024", "--layers", "8"]);
  server = await startServer(model, ["--ctx", "4096"]);
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
  page = await browser.newPage();
  page.setDefaultTimeout(60_000);
});

after(async () => {
  await browser?.close();
  if (server) assert.equal(await server.stop(), 0, "strata serve did not exit 0 on SIGTERM");
  if (thinker) assert.equal(await thinker.stop(), 0, "strata serve did not exit 0 on SIGTERM");
  if (streamed) assert.equal(await streamed.stop(), 0, "strata serve did not exit 0 on SIGTERM");
});

// Records every text the newest assistant bubble shows while a reply streams in.
async function watchAssistant() {
  await page.evaluate(() => {
    window.__seen = [];
    const observer = new MutationObserver(() => {
      const bubbles = document.querySelectorAll(".msg.assistant");
      const last = bubbles[bubbles.length - 1];
      const text = last?.querySelector(".answer")?.textContent ?? "";
      if (window.__seen.at(-1) !== text) window.__seen.push(text);
    });
    observer.observe(document.getElementById("messages"), { subtree: true, childList: true, characterData: true });
  });
}

// The n-th assistant bubble: its answer text, meta line, telemetry line (and the timings it
// shows), and thinking box (null when none).
async function assistant(n) {
  return page.locator(".msg.assistant").nth(n).evaluate((el) => {
    const details = el.querySelector("details.thinking");
    const telemetry = el.querySelector(".telemetry");
    return {
      text: el.querySelector(".answer")?.textContent ?? "",
      meta: el.querySelector(".meta")?.textContent ?? "",
      telemetry: telemetry?.textContent ?? "",
      timings: telemetry ? JSON.parse(telemetry.dataset.timings) : null,
      thinking: details ? { open: details.open, text: details.querySelector(".thought").textContent } : null,
    };
  });
}

async function send(text) {
  await page.fill("#input", text);
  await page.press("#input", "Enter");
}

async function settings(temperature, maxTokens) {
  await page.fill("#temperature", String(temperature));
  await page.fill("#max_tokens", String(maxTokens));
}

async function apiReply(messages, maxTokens) {
  const r = await fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: server.modelId, messages, temperature: 0, max_tokens: maxTokens }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).choices[0].message.content;
}

test("the chat page streams replies, reuses the cache and stops on request", async (t) => {
  try {
    await page.goto(server.url + "/");
    assert.equal(await page.title(), "strata chat");
    await waitFor("the page to show the model id", 30, async () => (await page.textContent("#model")) === server.modelId);

    // A first message: the reply streams in, then its usage line appears.
    await settings(0, 100);
    await watchAssistant();
    await send("Hello there");
    await page.locator(".msg.assistant .meta").first().filter({ hasText: /tokens/ }).waitFor();
    assert.equal(await page.locator(".msg.user").first().textContent(), "Hello there");
    const first = await assistant(0);
    assert.ok(first.text.length > 0, "empty reply");
    const seen = await page.evaluate(() => window.__seen.filter((t) => t.length > 0));
    assert.ok(seen.length >= 2, `the reply appeared in ${seen.length} step(s), not streamed: ${JSON.stringify(seen)}`);
    for (let i = 1; i < seen.length; ++i) assert.ok(seen[i].startsWith(seen[i - 1]), "the reply text did not only grow");
    t.diagnostic(`the first reply appeared in ${seen.length} steps`);
    assert.match(first.meta, /^\d+ tokens, /);
    // Its telemetry: prefill and decode speed from the server's timings, and the drafts when
    // speculation ran (no expert cache here).
    assert.equal(first.timings.predicted_n, Number(/^(\d+) tokens/.exec(first.meta)[1]));
    assert.match(first.telemetry, /^prefill \d+\.\d tok\/s · decode \d+\.\d tok\/s( · drafts \d+ of \d+ accepted)?$/);
    assert.equal(first.telemetry.split(" · ")[1], `decode ${first.timings.predicted_per_second.toFixed(1)} tok/s`);
    if (first.timings.draft_n !== undefined) {
      assert.ok(first.telemetry.endsWith(`drafts ${first.timings.draft_n_accepted} of ${first.timings.draft_n} accepted`));
    }
    // The panel says the experts are mapped: nothing streams.
    await waitFor("the panel to read the server", 10, async () => (await page.getAttribute("#cache", "data-streamed")) === "false");
    assert.match(await page.textContent("#cache-summary"), /always at hand/);
    assert.equal(await page.locator(".msg.error").count(), 0);
    // What the page shows is what the API answers for the same greedy request.
    assert.equal(first.text, await apiReply([{ role: "user", content: "Hello there" }], 100));

    // A second turn: the history the page resends is served from the prompt cache.
    await send("Tell me more");
    await page.locator(".msg.assistant .meta").nth(1).filter({ hasText: /tokens/ }).waitFor();
    const second = await assistant(1);
    const cached = /(\d+) of (\d+) prompt tokens cached/.exec(second.meta);
    assert.ok(cached, second.meta);
    assert.ok(Number(cached[1]) > 0, `nothing reused: ${second.meta}`);

    // Stop mid-stream: a long greedy reply (the end tokens cannot win here: the model with
    // this seed keeps going) is cut, the page is ready again, and the server cancels it.
    await settings(0, 3000);
    const before = await server.metrics();
    await send("Now write a very long answer");
    await waitFor("the third reply to start", 60, async () => (await assistant(2)).text.length > 0);
    await page.click("#stop");
    await waitFor("the page to be ready again", 30, async () => page.isEnabled("#send"));
    assert.equal(await page.isEnabled("#stop"), false);
    const stopped = await assistant(2);
    t.diagnostic(`stopped after ${[...stopped.text].length} characters`);
    assert.equal(stopped.meta, "", "the reply ran to its end before Stop took effect (no usage line expected)");
    await page.waitForTimeout(500);
    assert.equal((await assistant(2)).text, stopped.text, "the reply kept growing after Stop");
    const cancelledKey = 'strata_generations_total{finish_reason="cancelled"}';
    await waitFor("the server to count a cancelled generation", 30, async () => {
      const now = await server.metrics();
      return (now[cancelledKey] ?? 0) > (before[cancelledKey] ?? 0) && now.strata_generation_running === 0;
    });
    assert.equal(await page.locator(".msg.error").count(), 0);

    // New chat empties the conversation.
    await page.click("#clear");
    assert.equal(await page.locator("#messages > *").count(), 0);
  } catch (e) {
    const shot = path.join(outDir, "chat_page_failure.png");
    await page?.screenshot({ path: shot, fullPage: true }).catch(() => {});
    console.error(`screenshot of the page: ${shot}`);
    throw e;
  }
});

test("the reasoning of a thinking template shows in a collapsed box, apart from the answer", async () => {
  try {
    thinker = await startServer(synthModel("thinker"), ["--chat-template-file", chatTemplate("thinking.jinja")]);
    await page.goto(thinker.url + "/");
    await waitFor("the page to show the model id", 30, async () => (await page.textContent("#model")) === thinker.modelId);
    await settings(0, 20);
    await send("2+2?");
    await page.locator(".msg.assistant .meta").first().filter({ hasText: /tokens/ }).waitFor();
    const reply = await assistant(0);
    assert.ok(reply.thinking, "no thinking box");
    assert.equal(reply.thinking.open, false, "the thinking box starts collapsed");
    assert.ok(reply.thinking.text.length > 0, "the thinking box is empty");
    assert.ok(!reply.text.includes(reply.thinking.text), "the reasoning leaked into the answer");
    // What the box shows is the API's reasoning_content for the same greedy request.
    const r = await fetch(`${thinker.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: thinker.modelId, messages: [{ role: "user", content: "2+2?" }], temperature: 0, max_tokens: 20 }),
    });
    const message = (await r.json()).choices[0].message;
    assert.equal(reply.thinking.text, message.reasoning_content);
    assert.equal(reply.text, message.content);
    await page.click("details.thinking summary");
    assert.equal(await page.locator("details.thinking").first().evaluate((d) => d.open), true);
  } catch (e) {
    const shot = path.join(outDir, "chat_page_thinking_failure.png");
    await page?.screenshot({ path: shot, fullPage: true }).catch(() => {});
    console.error(`screenshot of the page: ${shot}`);
    throw e;
  }
});

test("the expert-cache panel follows a cache that streams, and each reply shows the cache's share", async () => {
  try {
    // Experts streamed from the model's pack through a cache of a few records (108 KiB each).
    const model = synthModel("streamed");
    strata("pack", model, "--no-progress");
    streamed = await startServer(model, ["--expert-budget", "512K"]);
    await page.goto(streamed.url + "/");
    await waitFor("the page to show the model id", 30, async () => (await page.textContent("#model")) === streamed.modelId);
    await waitFor("the panel to see a streamed cache", 10, async () => (await page.getAttribute("#cache", "data-streamed")) === "true");
    await settings(0, 60);
    await send("Tell me about expert caches");
    await page.locator(".msg.assistant .meta").first().filter({ hasText: /tokens/ }).waitFor();
    const reply = await assistant(0);
    assert.ok(reply.timings.expert_hit_rate >= 0 && reply.timings.expert_hit_rate <= 1, JSON.stringify(reply.timings));
    assert.match(reply.telemetry, / · expert hit \d+\.\d% · /);
    assert.ok(reply.telemetry.includes(`expert hit ${(100 * reply.timings.expert_hit_rate).toFixed(1)}%`), reply.telemetry);
    assert.match(reply.telemetry, / · stall \d+\.\d ms\/tok/);

    // The chart has a point per second; once the server is idle the panel shows what the
    // endpoint says: its hit rate, and the same residency map, layer by layer.
    await waitFor("three points on the chart", 15, async () => Number(await page.getAttribute("#cache-chart", "data-points")) >= 3);
    const api = await (await fetch(`${streamed.url}/expert-cache`)).json();
    const resident = api.resident.join("").split("").filter((c) => c === "1").length;
    assert.ok(api.misses > 0 && api.bytes_read > 0, JSON.stringify(api));
    await waitFor("the panel to catch up with the idle cache", 10, async () => {
      const shown = await page.evaluate(() => ({
        hitRate: document.getElementById("cache-summary").dataset.hitRate,
        layers: document.getElementById("cache-heat").dataset.layers,
        experts: document.getElementById("cache-heat").dataset.experts,
        resident: document.getElementById("cache-heat").dataset.resident,
      }));
      return shown.hitRate === String(api.hit_rate) && shown.layers === String(api.n_layers) &&
        shown.experts === String(api.n_experts) && shown.resident === String(resident);
    });
    // The heat map's pixels: a lit cell for each resident expert, layer by layer.
    const lit = await page.evaluate(() => {
      const canvas = document.getElementById("cache-heat");
      const layers = Number(canvas.dataset.layers), experts = Number(canvas.dataset.experts);
      const cell = canvas.width / experts, row = canvas.height / layers;
      const g = canvas.getContext("2d");
      const rows = [];
      for (let l = 0; l < layers; ++l) {
        let bits = "";
        for (let e = 0; e < experts; ++e) {
          const [r, gr, b] = g.getImageData(Math.floor(e * cell + cell / 2), Math.floor(l * row + row / 2), 1, 1).data;
          bits += r > 200 && gr > 100 && gr < 160 && b < 100 ? "1" : "0";
        }
        rows.push(bits);
      }
      return rows;
    });
    assert.deepEqual(lit, api.resident);
    await page.screenshot({ path: path.join(outDir, "chat_page_cache_panel.png"), fullPage: true });
  } catch (e) {
    const shot = path.join(outDir, "chat_page_cache_failure.png");
    await page?.screenshot({ path: shot, fullPage: true }).catch(() => {});
    console.error(`screenshot of the page: ${shot}`);
    throw e;
  }
});
