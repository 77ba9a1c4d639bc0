// Shared by the end-to-end tests in this folder: the command line every script takes, the npm
// packages they load, a synthetic model made with `strata synth`, and `strata serve` as a child
// process on a free port that is killed however the script ends.
//
//   node tests/e2e/<script>.mjs --strata BUILD/strata --modules NPM_PREFIX/node_modules --out DIR
//
// --out is where failure artifacts (screenshots) go. tests/test_server_e2e.cpp runs the scripts.
import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

const { values: args } = parseArgs({
  options: { strata: { type: "string" }, modules: { type: "string" }, out: { type: "string" } },
});
for (const name of ["strata", "modules", "out"]) {
  if (!args[name]) {
    console.error(`usage: node <script>.mjs --strata BINARY --modules NODE_MODULES --out DIR (--${name} is missing)`);
    process.exit(2);
  }
}
export const outDir = args.out;
mkdirSync(outDir, { recursive: true });

// A folder of this process's own, removed at exit.
export const workDir = mkdtempSync(path.join(tmpdir(), "strata-e2e-"));

const servers = new Set();

process.on("exit", (code) => {
  for (const server of servers) {
    server.child.kill("SIGKILL");
    if (code !== 0) console.error(`--- last lines of strata serve (pid ${server.pid}) ---\n${server.logTail(40)}`);
  }
  rmSync(workDir, { recursive: true, force: true });
});
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(1));

// Ends the script (and its servers) if it runs past `seconds`: a hang fails, it never blocks CI.
export function watchdog(seconds) {
  setTimeout(() => {
    console.error(`e2e: still running after ${seconds} s; giving up`);
    process.exit(1);
  }, seconds * 1000).unref();
}

// An npm package from --modules (CommonJS entry; openai and playwright-core ship one).
export function requirePackage(name) {
  const modules = path.resolve(args.modules);
  if (!existsSync(path.join(modules, name, "package.json"))) {
    throw new Error(`npm package ${name} is not installed under ${modules} (scripts/test.sh installs it)`);
  }
  return createRequire(path.join(modules, "e2e.js"))(name);
}

export function strata(...argv) {
  return execFileSync(args.strata, argv, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

// A synthetic qwen35moe model (random weights, a 512-token vocabulary) under workDir;
// `extra` are more `strata synth` flags (a bigger model is slower, which a test may need), `seed`
// picks the weights.
export function synthModel(name, extra = [], seed = 11) {
  const file = path.join(workDir, `${name}.gguf`);
  strata("synth", "--arch", "qwen35moe", "--preset", "tiny", "--seed", String(seed), "--no-progress", "-o", file, ...extra);
  return file;
}

// A chat template from tests/fixtures/chat_templates/ (for --chat-template-file).
export function chatTemplate(name) {
  return path.join(path.dirname(new URL(import.meta.url).pathname), "..", "fixtures", "chat_templates", name);
}

// The model's token ids for `text` (special tokens parsed), as logit_bias keys.
export function tokenIds(model, text) {
  return strata("tokenize", "-m", model, text).trim().split(",").map(Number);
}

// The token ids the model ends a reply with, for logit_bias to ban.
export function endTokenIds(model) {
  return tokenIds(model, "<|im_end|><|endoftext|>");
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Polls `check` (async, returns truthy when done) every 50 ms; throws `what` after `seconds`.
export async function waitFor(what, seconds, check) {
  const end = Date.now() + seconds * 1000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out after ${seconds} s waiting for ${what}`);
    await sleep(50);
  }
}

// Resident memory of a process in bytes (VmRSS of /proc/<pid>/status).
export function rssBytes(pid) {
  const match = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  if (!match) throw new Error(`no VmRSS line in /proc/${pid}/status`);
  return Number(match[1]) * 1024;
}

// Prometheus text -> {"name{labels}": value}.
export function parseMetrics(text) {
  const samples = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    samples[line.slice(0, at)] = Number(line.slice(at + 1));
  }
  return samples;
}

class ServerProcess {
  constructor(child) {
    this.child = child;
    this.pid = child.pid;
    this.lines = [];
    this.exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  }

  alive() {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  logTail(n) {
    return this.lines.slice(-n).join("\n");
  }

  async metrics() {
    return parseMetrics(await (await fetch(`${this.url}/metrics`)).text());
  }

  // SIGTERM, as a service manager stops it; returns the exit code (a clean stop is 0).
  async stop() {
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 30_000);
    const { code, signal } = await this.exited;
    clearTimeout(timer);
    servers.delete(this);
    if (signal) throw new Error(`strata serve ended by ${signal}:\n${this.logTail(20)}`);
    return code;
  }
}

// Starts `strata serve -m model --port 0 ...extra`, reads the port it prints and waits for
// /health. Returns a ServerProcess with url, modelId and pid.
export async function startServer(model, extra = []) {
  const argv = ["serve", "-m", model, "--port", "0", "--threads", "1", ...extra];
  const child = spawn(args.strata, argv, { stdio: ["ignore", "ignore", "pipe"] });
  const server = new ServerProcess(child);
  servers.add(server);
  const serving = /serving .* as '([^']+)' on (http:\/\/[^ ]+)/;
  const ready = new Promise((resolve, reject) => {
    createInterface({ input: child.stderr }).on("line", (line) => {
      server.lines.push(line);
      if (server.lines.length > 2000) server.lines.splice(0, 1000);
      const match = serving.exec(line);
      if (match) resolve(match);
    });
    server.exited.then(({ code, signal }) =>
      reject(new Error(`strata ${argv.join(" ")} exited (${signal ?? code}) before serving:\n${server.logTail(20)}`)));
    setTimeout(() => reject(new Error(`strata serve printed no address in 60 s:\n${server.logTail(20)}`)), 60_000).unref();
  });
  const [, modelId, url] = await ready;
  server.modelId = modelId;
  server.url = url;
  await waitFor(`${url}/health`, 30, async () => (await fetch(`${url}/health`).catch(() => null))?.status === 200);
  return server;
}
