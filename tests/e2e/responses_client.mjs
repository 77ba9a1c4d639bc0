// The official `openai` npm client's Responses API (responses.create and responses.stream)
// against strata's /v1/responses: text and item input with instructions, the stream assembling
// the same output as the plain call, history from the prompt cache, forced function calls and
// the function_call_output turn, text.format json_schema through constrained decoding,
// reasoning items from a template that opens <think>, and error classes. The models are
// synthetic: the text is noise, the protocol is what is checked.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { chatTemplate, requirePackage, startServer, synthModel, watchdog } from "./harness.mjs";

watchdog(150);
const { OpenAI } = requirePackage("openai");

const weatherTool = {
  type: "function",
  name: "get_weather",
  description: "Current weather in a city.",
  parameters: {
    type: "object",
    properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["celsius", "fahrenheit"] } },
    required: ["city", "unit"],
    additionalProperties: false,
  },
  strict: true,
};

// The text of a response's message items (what create()'s output_text getter joins; a streamed
// final response has no such getter).
const textOf = (r) => r.output.filter((i) => i.type === "message")
  .flatMap((i) => i.content).filter((c) => c.type === "output_text").map((c) => c.text).join("");

async function apiError(request) {
  try {
    await request();
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `expected an APIError, got ${e}`);
    return e;
  }
  assert.fail("the request succeeded; an error was expected");
}

describe("openai responses API", () => {
  let server;
  let thinker;
  let client;
  let model;

  before(async () => {
    server = await startServer(synthModel("tiny"), ["--ctx", "2048"]);
    model = server.modelId;
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    if (server) assert.equal(await server.stop(), 0, "strata serve did not exit 0 on SIGTERM");
    if (thinker) assert.equal(await thinker.stop(), 0);
  });

  test("responses.create: text input and instructions give a message item", async () => {
    const r = await client.responses.create({ model, input: "Hello there", instructions: "Be brief.", max_output_tokens: 16 });
    assert.equal(r.object, "response");
    assert.match(r.id, /^resp_/);
    assert.ok(["completed", "incomplete"].includes(r.status), r.status);
    if (r.status === "incomplete") assert.equal(r.incomplete_details.reason, "max_output_tokens");
    assert.equal(r.instructions, "Be brief.");
    assert.equal(r.output[0].type, "message");
    assert.equal(r.output[0].role, "assistant");
    assert.equal(r.output[0].content[0].type, "output_text");
    assert.equal(r.output_text, r.output[0].content[0].text);
    assert.ok(r.usage.input_tokens > 0);
    assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 16);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  });

  test("responses.stream assembles the same output as the plain call", async () => {
    const request = { model, input: [{ role: "user", content: "Write a line." }], max_output_tokens: 24 };
    const whole = await client.responses.create(request);
    const stream = client.responses.stream(request);
    const types = [];
    let deltas = "";
    stream.on("event", (e) => types.push(e.type));
    stream.on("response.output_text.delta", (e) => (deltas += e.delta));
    const final = await stream.finalResponse();
    assert.equal(types[0], "response.created");
    assert.ok(["response.completed", "response.incomplete"].includes(types.at(-1)), types.at(-1));
    assert.ok(types.includes("response.output_item.added") && types.includes("response.output_item.done"));
    assert.equal(textOf(final), whole.output_text);
    assert.equal(deltas, whole.output_text);
  });

  test("item input: history with an assistant turn is served from the prompt cache", async () => {
    const first = await client.responses.create({ model, input: "One", max_output_tokens: 8 });
    const second = await client.responses.create({
      model, max_output_tokens: 8,
      input: [{ role: "user", content: "One" }, ...first.output, { role: "user", content: [{ type: "input_text", text: "Two" }] }],
    });
    assert.ok(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens,
      `${JSON.stringify(second.usage)} after a first prompt of ${first.usage.input_tokens}`);
  });

  test("a forced function call comes back as a function_call item; its output goes back in", async () => {
    const request = { model, input: "Weather in Paris?", tools: [weatherTool], tool_choice: { type: "function", name: "get_weather" },
      max_output_tokens: 300 };
    const r = await client.responses.create(request);
    const calls = r.output.filter((i) => i.type === "function_call");
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    assert.equal(calls[0].name, "get_weather");
    assert.match(calls[0].call_id, /^call_/);
    const args = JSON.parse(calls[0].arguments);
    assert.deepEqual(Object.keys(args).sort(), ["city", "unit"]);

    const streamed = await client.responses.stream(request).finalResponse();
    const streamedCalls = streamed.output.filter((i) => i.type === "function_call");
    assert.deepEqual(streamedCalls.map((c) => [c.name, c.arguments]), calls.map((c) => [c.name, c.arguments]));

    const next = await client.responses.create({ model, tools: [weatherTool], max_output_tokens: 8,
      input: [{ role: "user", content: "Weather in Paris?" }, calls[0], { type: "function_call_output", call_id: calls[0].call_id, output: "21 C" }] });
    assert.equal(next.output.at(-1).type, "message");
  });

  test("text.format json_schema: the output text parses and follows the schema", async () => {
    const schema = { type: "object", properties: { verdict: { enum: ["yes", "no"] }, note: { type: "string", maxLength: 10 } },
      required: ["verdict", "note"], additionalProperties: false };
    for (const max_output_tokens of [200, 30]) {
      const r = await client.responses.create({ model, input: "Is it sunny?", max_output_tokens, temperature: 1,
        text: { format: { type: "json_schema", name: "verdict", schema, strict: true } } });
      assert.equal(r.status, "completed", r.output_text);
      const value = JSON.parse(r.output_text);
      assert.ok(["yes", "no"].includes(value.verdict), r.output_text);
      assert.ok([...value.note].length <= 10, r.output_text);
    }
  });

  test("reasoning items from a template that opens <think>", async () => {
    thinker = await startServer(synthModel("thinker"), ["--chat-template-file", chatTemplate("thinking.jinja")]);
    const thinking = new OpenAI({ baseURL: `${thinker.url}/v1`, apiKey: "none", maxRetries: 0 });
    const request = { model: thinker.modelId, input: "2+2?", max_output_tokens: 12, reasoning: { effort: "medium" } };
    const r = await thinking.responses.create(request);
    assert.equal(r.output[0].type, "reasoning", JSON.stringify(r.output));
    assert.ok(r.output[0].content[0].text.length > 0);
    assert.ok(!r.output_text.includes("think>"));
    const streamed = await thinking.responses.stream(request).finalResponse();
    assert.equal(streamed.output[0].type, "reasoning");
    assert.equal(streamed.output[0].content[0].text, r.output[0].content[0].text);

    // The reasoning item goes back as input; effort "none" turns thinking off.
    const off = await thinking.responses.create({ model: thinker.modelId, max_output_tokens: 8, reasoning: { effort: "none" },
      input: [{ role: "user", content: "2+2?" }, ...r.output, { role: "user", content: "And 3+3?" }] });
    assert.ok(off.output.every((i) => i.type !== "reasoning"), JSON.stringify(off.output));
  });

  test("bad requests throw the client's error classes", async () => {
    let e = await apiError(() => client.responses.create({ model: "nope", input: "hi" }));
    assert.ok(e instanceof OpenAI.NotFoundError);
    e = await apiError(() => client.responses.create({ model, input: "hi", frobnicate: 1 }));
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, "frobnicate");
    e = await apiError(() => client.responses.create({ model, input: [{ type: "function_call", name: "f" }] }));
    assert.equal(e.status, 400);
    assert.match(e.param, /input\[0\]\.(call_id|arguments)/);
    e = await apiError(() => client.responses.create({ model, input: "hi", previous_response_id: "resp_x" }));
    assert.ok(e instanceof OpenAI.UnprocessableEntityError);
    e = await apiError(() => client.responses.create({ model, input: "hi", tools: [{ type: "web_search" }] }));
    assert.equal(e.status, 422);
    e = await apiError(() => client.responses.create({ model, input: "hi", text: { format: { type: "json_schema", name: "x",
      schema: { type: "string", pattern: "^a" } } } }));
    assert.equal(e.status, 400);
    assert.ok(server.alive());
  });
});
