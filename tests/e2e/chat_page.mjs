// The chat page at / in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core):
// it loads and names the model, a sent message gets a streamed reply that grows on screen and
// equals the API's reply for the same greedy request, a second turn is served from the prompt
// cache, and Stop ends a long reply mid-stream, which the server counts as a cancelled
// generation; with a template that opens <think>, the reasoning streams into a collapsed
// "Thinking" box, apart from the answer. On failure a screenshot goes to --out.
import assert from "node:assert/strict";
import path from "node:path";
import { after, before, test } from "node:test";

import { chatTemplate, outDir, requirePackage, startServer, synthModel, waitFor, watchdog } from "./harness.mjs";

watchdog(150);
const { chromium } = requirePackage("playwright-core");

let server;
let thinker;
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

// The n-th assistant bubble: its answer text, meta line, and thinking box (null when none).
async function assistant(n) {
  return page.locator(".msg.assistant").nth(n).evaluate((el) => {
    const details = el.querySelector("details.thinking");
    return {
      text: el.querySelector(".answer")?.textContent ?? "",
      meta: el.querySelector(".meta")?.textContent ?? "",
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
