// The official Anthropic SDK (@anthropic-ai/sdk, pinned in scripts/test.sh) against strata's
// Messages API: plain and streamed messages (the SDK's stream assembles the same message),
// system prompts and multi-turn history from the prompt cache, stop_sequences, forced tool use
// (plain and streamed, the input validating against the tool's schema) and the tool_result turn
// after it, thinking blocks (a server with a template that opens <think>), count_tokens, and the
// SDK's error classes for Anthropic-shaped errors. The models are synthetic: the text is noise,
// the protocol is what is checked.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { chatTemplate, requirePackage, startServer, synthModel, watchdog } from "./harness.mjs";

watchdog(150);
const sdk = requirePackage("@anthropic-ai/sdk");
const Anthropic = sdk.Anthropic ?? sdk.default;
const API_KEY = "e2e-anthropic";

const weatherTool = {
  name: "get_weather",
  description: "Current weather in a city.",
  input_schema: {
    type: "object",
    properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["celsius", "fahrenheit"] } },
    required: ["city", "unit"],
    additionalProperties: false,
  },
};
const timeTool = { name: "get_time", input_schema: { type: "object", properties: { zone: { type: "string", maxLength: 8 } } } };

function assertWeatherInput(input) {
  assert.deepEqual(Object.keys(input).sort(), ["city", "unit"], JSON.stringify(input));
  assert.ok([...input.city].length <= 12);
  assert.ok(["celsius", "fahrenheit"].includes(input.unit));
}

const user = (content) => [{ role: "user", content }];
const textOf = (message) => message.content.filter((b) => b.type === "text").map((b) => b.text).join("");

async function apiError(request) {
  try {
    await request();
  } catch (e) {
    assert.ok(e instanceof Anthropic.APIError, `expected an APIError, got ${e}`);
    return e;
  }
  assert.fail("the request succeeded; an error was expected");
}

describe("@anthropic-ai/sdk", () => {
  let server;
  let thinker;
  let client;
  let model;

  before(async () => {
    // Seed 4's greedy replies are plain ASCII ("taltal..."), which stop_sequences can match.
    server = await startServer(synthModel("plain", [], 4), ["--api-key", API_KEY, "--ctx", "2048"]);
    model = server.modelId;
    client = new Anthropic({ baseURL: server.url, apiKey: API_KEY, maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    if (server) assert.equal(await server.stop(), 0, "strata serve did not exit 0 on SIGTERM");
    if (thinker) assert.equal(await thinker.stop(), 0);
  });

  test("messages.create: a message with text content and usage", async () => {
    const m = await client.messages.create({ model, max_tokens: 16, temperature: 0, messages: user("Hello there") });
    assert.equal(m.type, "message");
    assert.equal(m.role, "assistant");
    assert.match(m.id, /^msg_/);
    assert.equal(m.model, model);
    assert.equal(m.content[0].type, "text");
    assert.ok(["end_turn", "max_tokens"].includes(m.stop_reason), m.stop_reason);
    assert.equal(m.stop_sequence, null);
    assert.ok(m.usage.input_tokens > 0);
    assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 16, JSON.stringify(m.usage));
  });

  test("messages.stream assembles the same message as the plain call", async () => {
    const request = { model, max_tokens: 24, temperature: 0, system: "You are terse.", messages: user("Write a line.") };
    const whole = await client.messages.create(request);
    const stream = client.messages.stream(request);
    const types = [];
    let streamedText = "";
    stream.on("streamEvent", (e) => types.push(e.type));
    stream.on("text", (delta) => (streamedText += delta));
    const final = await stream.finalMessage();
    assert.equal(types[0], "message_start");
    assert.equal(types.at(-1), "message_stop");
    assert.ok(types.includes("content_block_start") && types.includes("content_block_delta"), types.join(","));
    assert.equal(textOf(final), textOf(whole));
    assert.equal(streamedText, textOf(whole));
    assert.equal(final.stop_reason, whole.stop_reason);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  });

  test("multi-turn history is served from the prompt cache", async () => {
    const first = await client.messages.create({ model, max_tokens: 8, temperature: 0, system: "Be brief.", messages: user("One") });
    const second = await client.messages.create({
      model, max_tokens: 8, temperature: 0, system: [{ type: "text", text: "Be brief." }],
      messages: [...user("One"), { role: "assistant", content: first.content }, ...user([{ type: "text", text: "Two" }])],
    });
    assert.ok(second.usage.cache_read_input_tokens > 0, JSON.stringify(second.usage));
    assert.equal(second.role, "assistant");
  });

  test("stop_sequences end the reply before the sequence and name it", async () => {
    const request = { model, max_tokens: 24, temperature: 0, messages: user("Say something") };
    const text = textOf(await client.messages.create(request));
    assert.match(text, /^[\x20-\x7e]{6,}/, `seed 4's reply is no longer ASCII: ${JSON.stringify(text)}`);
    const stop = text.slice(2, 5);
    const m = await client.messages.create({ ...request, stop_sequences: ["\u0001never", stop] });
    assert.equal(m.stop_reason, "stop_sequence");
    assert.equal(m.stop_sequence, stop);
    assert.equal(textOf(m), text.slice(0, text.indexOf(stop)));
  });

  test('tool_choice "tool" forces a valid tool_use; the tool_result turn is accepted', async () => {
    const request = { model, max_tokens: 300, temperature: 0, tools: [weatherTool, timeTool],
      tool_choice: { type: "tool", name: "get_weather" }, messages: user("Weather in Paris?") };
    const m = await client.messages.create(request);
    assert.equal(m.stop_reason, "tool_use");
    const uses = m.content.filter((b) => b.type === "tool_use");
    assert.equal(uses.length, 1, JSON.stringify(m.content));
    assert.match(uses[0].id, /^toolu_/);
    assert.equal(uses[0].name, "get_weather");
    assertWeatherInput(uses[0].input);

    // Streamed, the SDK assembles the input from input_json_delta events.
    const streamed = await client.messages.stream(request).finalMessage();
    const streamedUses = streamed.content.filter((b) => b.type === "tool_use");
    assert.deepEqual(streamedUses.map((b) => [b.name, b.input]), uses.map((b) => [b.name, b.input]));

    const followUp = await client.messages.create({
      model, max_tokens: 8, tools: [weatherTool, timeTool],
      messages: [...user("Weather in Paris?"), { role: "assistant", content: m.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: uses[0].id, content: "21 degrees" },
          { type: "text", text: "Thanks!" }] }],
    });
    assert.equal(followUp.role, "assistant");
  });

  test('tool_choice "any" with parallel use disabled makes exactly one call', async () => {
    const m = await client.messages.create({ model, max_tokens: 300, temperature: 1, tools: [weatherTool, timeTool],
      tool_choice: { type: "any", disable_parallel_tool_use: true }, messages: user("Weather or time?") });
    const uses = m.content.filter((b) => b.type === "tool_use");
    assert.equal(uses.length, 1, JSON.stringify(m.content));
    assert.ok(["get_weather", "get_time"].includes(uses[0].name));
    if (uses[0].name === "get_weather") assertWeatherInput(uses[0].input);
  });

  test("thinking: a template that opens <think> gives a thinking block before the text", async () => {
    thinker = await startServer(synthModel("thinker"), ["--chat-template-file", chatTemplate("thinking.jinja")]);
    const thinking = new Anthropic({ baseURL: thinker.url, apiKey: "any", maxRetries: 0 });
    const request = { model: thinker.modelId, max_tokens: 30, temperature: 0, messages: user("2+2?"),
      thinking: { type: "enabled", budget_tokens: 5 } };
    const m = await thinking.messages.create(request);
    assert.deepEqual(m.content.map((b) => b.type).slice(0, 1), ["thinking"], JSON.stringify(m.content));
    assert.ok(m.content[0].thinking.length > 0);
    assert.equal(typeof m.content[0].signature, "string");
    for (const b of m.content.filter((b) => b.type === "text")) assert.ok(!b.text.includes("think>"), b.text);

    const streamed = await thinking.messages.stream(request).finalMessage();
    assert.deepEqual(streamed.content.map((b) => [b.type, b.thinking ?? b.text]), m.content.map((b) => [b.type, b.thinking ?? b.text]));

    // The thinking block goes back in the history; thinking disabled gives no block.
    const off = await thinking.messages.create({ model: thinker.modelId, max_tokens: 10, temperature: 0,
      messages: [...user("2+2?"), { role: "assistant", content: m.content }, ...user("And 3+3?")], thinking: { type: "disabled" } });
    assert.ok(off.content.every((b) => b.type !== "thinking"), JSON.stringify(off.content));
  });

  test("count_tokens counts the prompt the template renders", async () => {
    const request = { model, system: "Be brief.", messages: user("Count me"), tools: [weatherTool] };
    const { input_tokens } = await client.messages.countTokens(request);
    const m = await client.messages.create({ ...request, max_tokens: 1, temperature: 0 });
    assert.equal(input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  });

  test("bad requests: Anthropic's error shape and the SDK's error classes", async () => {
    const base = { model, max_tokens: 4, messages: user("hi") };
    let e = await apiError(() => client.messages.create({ ...base, model: "claude-nope" }));
    assert.ok(e instanceof Anthropic.NotFoundError);
    assert.equal(e.error.type, "error");
    assert.equal(e.error.error.type, "not_found_error");

    e = await apiError(() => client.messages.create({ model, messages: user("hi") }));
    assert.ok(e instanceof Anthropic.BadRequestError);
    assert.equal(e.error.error.type, "invalid_request_error");
    assert.match(e.error.error.message, /max_tokens/);

    e = await apiError(() => client.messages.create({ ...base, temperature: 1.5 }));
    assert.equal(e.status, 400);
    assert.match(e.error.error.message, /temperature/);

    e = await apiError(() => client.messages.create({ ...base, frobnicate: 1 }));
    assert.equal(e.status, 400);
    assert.match(e.error.error.message, /frobnicate/);

    e = await apiError(() => client.messages.create({ ...base, messages: [{ role: "user", content: [{ type: "text", txt: "x" }] }] }));
    assert.match(e.error.error.message, /messages\.0\.content\.0/);

    e = await apiError(() => client.messages.create({ ...base, messages: [{ role: "user", content: [{ type: "image",
      source: { type: "base64", media_type: "image/png", data: "AA==" } }] }] }));
    assert.equal(e.status, 400);

    e = await apiError(() => client.messages.create({ ...base, max_tokens: 100_000 }));
    assert.equal(e.status, 400);

    const stranger = new Anthropic({ baseURL: server.url, apiKey: "wrong", maxRetries: 0 });
    e = await apiError(() => stranger.messages.create(base));
    assert.ok(e instanceof Anthropic.AuthenticationError);
    assert.equal(e.error.error.type, "authentication_error");

    assert.ok(server.alive());
    assert.equal((await client.messages.create(base)).role, "assistant");
  });
});
