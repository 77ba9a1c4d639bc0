// Loopback load on a running `strata serve`: for each count N of concurrent streams, N
// completions are sent at once (each to run its whole max_tokens: the end tokens are banned),
// and the aggregate decode speed is the tokens generated after each stream's first, over the time
// from the first stream's first token to the last stream's end. One JSON line per N, so runs at
// --parallel 1 and --parallel 8 compare directly (docs/PERFORMANCE.md).
//
//   node bench/serve_load.mjs --url http://127.0.0.1:8080 [--streams 1,2,4,8] [--tokens 128]
//
// Needs Node 18+ (fetch) and nothing else.
import { parseArgs } from "node:util";

const { values: args } = parseArgs({
  options: {
    url: { type: "string", default: "http://127.0.0.1:8080" },
    streams: { type: "string", default: "1,2,4,8" },
    tokens: { type: "string", default: "128" },
    "api-key": { type: "string", default: "" },
  },
});
const headers = { "Content-Type": "application/json" };
if (args["api-key"]) headers.Authorization = `Bearer ${args["api-key"]}`;
const tokens = Number(args.tokens);

async function call(path, body) {
  const r = await fetch(args.url + path, { method: "POST", headers, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r;
}

const model = (await (await fetch(`${args.url}/v1/models`, { headers })).json()).data[0].id;
const ends = (await (await call("/tokenize", { content: "<|im_end|><|endoftext|>", parse_special: true })).json()).tokens;
const bias = Object.fromEntries(ends.map((id) => [String(id), -100]));

// One stream: the time of its first token and of its end, and its token count.
async function stream(i) {
  const r = await call("/v1/completions", {
    model, prompt: `Stream ${i}: tell a long story about`, max_tokens: tokens, stream: true,
    stream_options: { include_usage: true }, temperature: 1, seed: i, logit_bias: bias,
  });
  const decoder = new TextDecoder();
  let first = null, usage = null, buffer = "";
  for await (const bytes of r.body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const chunk = JSON.parse(event.slice(6));
      if (chunk.usage) usage = chunk.usage;
      else if (first === null && chunk.choices[0]?.text) first = performance.now();
    }
  }
  return { first, end: performance.now(), tokens: usage.completion_tokens };
}

for (const n of args.streams.split(",").map(Number)) {
  const runs = await Promise.all(Array.from({ length: n }, (_, i) => stream(i)));
  const start = Math.min(...runs.map((r) => r.first));
  const end = Math.max(...runs.map((r) => r.end));
  const decoded = runs.reduce((sum, r) => sum + r.tokens - 1, 0);
  const perStream = runs.map((r) => (r.tokens - 1) / ((r.end - r.first) / 1000));
  console.log(JSON.stringify({
    streams: n, tokens_per_stream: tokens, aggregate_decode_tok_per_s: decoded / ((end - start) / 1000),
    per_stream_tok_per_s: perStream.map((v) => Number(v.toFixed(2))),
  }));
}
