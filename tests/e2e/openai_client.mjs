// The official `openai` npm client against `strata serve`: models, chat (plain, streamed, multi
// turn), forced tool calls, JSON mode and JSON Schema output, /v1/completions, and the error
// classes the client throws for the server's error bodies. The model is synthetic (random
// weights), so the text is noise: what is checked is the protocol, determinism (a streamed reply
// assembles to the non-streamed one for the same seed) and what constrained decoding guarantees.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { requirePackage, startServer, synthModel, tokenIds, watchdog } from "./harness.mjs";

watchdog(150);
const { OpenAI } = requirePackage("openai");
const API_KEY = "e2e-secret";
const MAX_BODY = 65536;

// A tool whose arguments the constraint must make valid: every field bounded, so the
// random model finishes the call well within max_tokens.
const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", maxLength: 12 },
        unit: { enum: ["celsius", "fahrenheit"] },
      },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};
const timeTool = {
  type: "function",
  function: { name: "get_time", parameters: { type: "object", properties: { zone: { type: "string", maxLength: 8 } } } },
};

function assertWeatherArguments(text) {
  const args = JSON.parse(text);
  assert.deepEqual(Object.keys(args).sort(), ["city", "unit"], text);
  assert.equal(typeof args.city, "string");
  assert.ok([...args.city].length <= 12, text);
  assert.ok(["celsius", "fahrenheit"].includes(args.unit), text);
}

// Runs `request` and returns the APIError it throws (failing if it succeeds or throws else).
async function apiError(request) {
  try {
    await request();
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    return e;
  }
  assert.fail("the request succeeded; an error was expected");
}

describe("openai npm client", () => {
  let server;
  let client;
  let model;
  let modelPath;
  const user = (content) => [{ role: "user", content }];

  before(async () => {
    modelPath = synthModel("tiny");
    server = await startServer(modelPath, ["--api-key", API_KEY, "--max-body", String(MAX_BODY), "--ctx", "2048"]);
    model = server.modelId;
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    if (server) assert.equal(await server.stop(), 0, "strata serve did not exit 0 on SIGTERM");
  });

  test("lists and retrieves the served model", async () => {
    const page = await client.models.list();
    assert.deepEqual(page.data.map((m) => m.id), [model]);
    const one = await client.models.retrieve(model);
    assert.equal(one.id, model);
    assert.equal(one.object, "model");
  });

  test("non-streaming chat: an assistant message with usage", async () => {
    const r = await client.chat.completions.create({ model, messages: user("Hello there"), max_tokens: 24, temperature: 0 });
    assert.equal(r.object, "chat.completion");
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.model, model);
    assert.equal(r.choices.length, 1);
    const [choice] = r.choices;
    assert.equal(choice.message.role, "assistant");
    assert.equal(typeof choice.message.content, "string");
    assert.ok(["stop", "length"].includes(choice.finish_reason), choice.finish_reason);
    assert.ok(r.usage.prompt_tokens > 0);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 24, JSON.stringify(r.usage));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  });

  for (const [label, sampling] of [["greedy", { temperature: 0 }], ["sampled, same seed", { temperature: 1, top_p: 0.9, seed: 1234 }]]) {
    test(`streamed deltas assemble to the non-streamed reply (${label})`, async () => {
      const request = { model, messages: user("Write a line about experts."), max_tokens: 48, ...sampling };
      const whole = await client.chat.completions.create(request);
      const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
      let text = "";
      let finish = null;
      let usage = null;
      let chunks = 0;
      for await (const chunk of stream) {
        assert.equal(chunk.object, "chat.completion.chunk");
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices) {
          text += choice.delta.content ?? "";
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        ++chunks;
      }
      assert.ok(chunks >= 2, `${chunks} chunks`);
      assert.equal(text, whole.choices[0].message.content);
      assert.equal(finish, whole.choices[0].finish_reason);
      assert.ok(usage, "no usage chunk despite stream_options.include_usage");
      assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
    });
  }

  test("a second turn reuses the first turn's prompt from the cache", async () => {
    const first = await client.chat.completions.create({ model, messages: user("First question"), max_tokens: 12, seed: 5 });
    const messages = [...user("First question"), first.choices[0].message, ...user("Second question")];
    const second = await client.chat.completions.create({ model, messages, max_tokens: 12, seed: 5 });
    const cached = second.usage.prompt_tokens_details?.cached_tokens;
    assert.ok(cached >= first.usage.prompt_tokens, `cached ${cached} of ${second.usage.prompt_tokens}, first prompt ${first.usage.prompt_tokens}`);
    assert.ok(cached < second.usage.prompt_tokens);
  });

  test("tool_choice naming a function forces a valid call to it", async () => {
    const r = await client.chat.completions.create({
      model, messages: user("Weather in Paris?"), tools: [weatherTool, timeTool], max_tokens: 400, seed: 3,
      tool_choice: { type: "function", function: { name: "get_weather" } },
    });
    const { message, finish_reason } = r.choices[0];
    assert.ok(["tool_calls", "stop"].includes(finish_reason), finish_reason);
    assert.equal(message.tool_calls?.length, 1, JSON.stringify(message));
    const [call] = message.tool_calls;
    assert.equal(call.type, "function");
    assert.equal(typeof call.id, "string");
    assert.equal(call.function.name, "get_weather");
    assertWeatherArguments(call.function.arguments);

    // The call and its result go back as history; the server must accept them.
    const followUp = await client.chat.completions.create({
      model, max_tokens: 8, tools: [weatherTool, timeTool],
      messages: [...user("Weather in Paris?"), message,
        { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature: 21 }) }],
    });
    assert.equal(followUp.choices[0].message.role, "assistant");
  });

  test('tool_choice "required" streamed: the SDK assembles the same call as the plain reply', async () => {
    const request = { model, messages: user("Weather or time?"), tools: [weatherTool, timeTool], tool_choice: "required",
      parallel_tool_calls: false, max_tokens: 400, seed: 8 };
    const whole = await client.chat.completions.create(request);
    const calls = whole.choices[0].message.tool_calls;
    assert.equal(calls?.length, 1, JSON.stringify(whole.choices[0].message));
    assert.ok(["get_weather", "get_time"].includes(calls[0].function.name), calls[0].function.name);
    const args = JSON.parse(calls[0].function.arguments);
    if (calls[0].function.name === "get_weather") assertWeatherArguments(calls[0].function.arguments);
    else assert.equal(typeof args, "object");

    const streamed = await client.chat.completions.stream(request).finalChatCompletion();
    const streamedCalls = streamed.choices[0].message.tool_calls;
    assert.deepEqual(streamedCalls.map((c) => [c.function.name, c.function.arguments]),
      calls.map((c) => [c.function.name, c.function.arguments]));
  });

  test('response_format "json_object": the content is a JSON object', async () => {
    // The random model rarely closes an object it was free to fill within max_tokens, so this
    // request makes "}" win wherever the constraint allows it: the reply must be a whole object
    // that ends by itself, whatever the seed.
    const closeBrace = tokenIds(modelPath, "}");
    assert.equal(closeBrace.length, 1);
    const closing = await client.chat.completions.create({
      model, messages: user("Reply in JSON."), response_format: { type: "json_object" }, max_tokens: 100,
      logit_bias: { [closeBrace[0]]: 100 },
    });
    assert.equal(closing.choices[0].finish_reason, "stop", closing.choices[0].message.content);
    assert.deepEqual(JSON.parse(closing.choices[0].message.content), {});

    // Left alone, sampled: the constraint steers every reply to an object that closes within
    // max_tokens (docs/CONSTRAINED.md), however small.
    for (const [seed, max_tokens] of [[1, 200], [2, 200], [3, 60], [4, 30], [5, 12], [6, 3]]) {
      const r = await client.chat.completions.create({
        model, messages: user("Reply in JSON."), response_format: { type: "json_object" }, max_tokens, seed, temperature: 1,
      });
      const content = r.choices[0].message.content;
      assert.equal(r.choices[0].finish_reason, "stop", `max_tokens ${max_tokens}: ${content}`);
      const value = JSON.parse(content);
      assert.ok(value !== null && typeof value === "object" && !Array.isArray(value), content);
      assert.ok(r.usage.completion_tokens < max_tokens, JSON.stringify(r.usage));
    }
  });

  test('response_format "json_schema": the content parses and follows the schema', async () => {
    const schema = {
      type: "object",
      properties: {
        verdict: { enum: ["yes", "no", "maybe"] },
        confidence: { type: "integer" },
        tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 3 },
      },
      required: ["verdict", "confidence", "tags"],
      additionalProperties: false,
    };
    const r = await client.chat.completions.create({
      model, messages: user("Is it sunny?"), max_tokens: 400, seed: 4,
      response_format: { type: "json_schema", json_schema: { name: "verdict", schema, strict: true } },
    });
    const content = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, "stop", `the document did not end within max_tokens: ${content}`);
    const value = JSON.parse(content);
    assert.deepEqual(Object.keys(value).sort(), ["confidence", "tags", "verdict"], content);
    assert.ok(["yes", "no", "maybe"].includes(value.verdict), content);
    assert.ok(Number.isInteger(value.confidence), content);
    assert.ok(Array.isArray(value.tags) && value.tags.length <= 3, content);
    for (const tag of value.tags) assert.ok(typeof tag === "string" && [...tag].length <= 6, content);
  });

  test("/v1/completions: plain, streamed (same text) and echo", async () => {
    const request = { model, prompt: "Once upon a time", max_tokens: 20, temperature: 0 };
    const whole = await client.completions.create(request);
    assert.equal(whole.object, "text_completion");
    assert.match(whole.id, /^cmpl-/);
    assert.equal(typeof whole.choices[0].text, "string");
    assert.ok(whole.usage.completion_tokens >= 1 && whole.usage.completion_tokens <= 20);
    let text = "";
    for await (const chunk of await client.completions.create({ ...request, stream: true })) text += chunk.choices[0]?.text ?? "";
    assert.equal(text, whole.choices[0].text);
    const echoed = await client.completions.create({ ...request, echo: true });
    assert.equal(echoed.choices[0].text, request.prompt + whole.choices[0].text);
  });

  test("bad requests throw the client's APIError subclasses with OpenAI error bodies", async () => {
    const base = { model, messages: user("hi"), max_tokens: 4 };

    let e = await apiError(() => client.chat.completions.create({ ...base, model: "no-such-model" }));
    assert.ok(e instanceof OpenAI.NotFoundError);
    assert.equal(e.status, 404);
    assert.equal(e.code, "model_not_found");
    assert.equal(e.param, "model");
    assert.match(e.message, /no-such-model/);

    e = await apiError(() => client.models.retrieve("no-such-model"));
    assert.equal(e.status, 404);

    e = await apiError(() => client.chat.completions.create({ ...base, temperature: 7 }));
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, "temperature");
    assert.equal(e.type, "invalid_request_error");

    e = await apiError(() => client.chat.completions.create({ ...base, messages: [] }));
    assert.equal(e.status, 400);

    e = await apiError(() => client.chat.completions.create({ ...base, max_tokens: 100_000 }));
    assert.equal(e.status, 400);
    assert.equal(e.code, "context_length_exceeded");

    e = await apiError(() => client.chat.completions.create({ ...base, frobnicate: true }));
    assert.equal(e.status, 400);

    e = await apiError(() => client.chat.completions.create({ ...base, tool_choice: "required" }));
    assert.equal(e.status, 400);
    assert.equal(e.param, "tool_choice");

    e = await apiError(() => client.chat.completions.create({ ...base, n: 2 }));
    assert.ok(e instanceof OpenAI.UnprocessableEntityError);
    assert.equal(e.status, 422);

    e = await apiError(() => client.chat.completions.create({ ...base, messages: user("x".repeat(2 * MAX_BODY)) }));
    assert.equal(e.status, 413);

    const stranger = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "wrong-key", maxRetries: 0 });
    e = await apiError(() => stranger.models.list());
    assert.ok(e instanceof OpenAI.AuthenticationError);
    assert.equal(e.status, 401);

    // None of it hurt the server.
    assert.ok(server.alive());
    const ok = await client.chat.completions.create(base);
    assert.equal(ok.choices[0].message.role, "assistant");
  });
});
