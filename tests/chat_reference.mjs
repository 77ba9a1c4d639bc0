// Renders chat templates with @huggingface/jinja (the Jinja engine of transformers.js), the
// reference the C++ renderer is compared against (tests/test_chat_reference.cpp).
//
//   node chat_reference.mjs <node_modules dir> <cases.json> <results.json>
//
// cases.json: {"templates": {id: source}, "cases": [{"template": id, "variables": {...}}]}
// results.json: one entry per case, {"output": text} or {"error": message}.
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, casesPath, resultsPath] = process.argv.slice(2);
const entry = path.join(modules, "@huggingface", "jinja", "dist", "index.js");
if (!existsSync(entry)) {
  console.error(`chat_reference: ${entry} is missing; install it with ` +
    "`npm install --prefix build/npm @huggingface/jinja`");
  process.exit(2);
}
const { Template } = await import(pathToFileURL(entry).href);

const input = JSON.parse(readFileSync(casesPath, "utf8"));
const parsed = {};
for (const [id, source] of Object.entries(input.templates)) parsed[id] = new Template(source);
const results = input.cases.map(({ template, variables }) => {
  try {
    return { output: parsed[template].render(variables) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
});
writeFileSync(resultsPath, JSON.stringify(results));
