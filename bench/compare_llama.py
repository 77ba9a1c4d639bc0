#!/usr/bin/env python3
"""strata against llama.cpp on one GGUF file, interleaved, for a shared machine.

Each round runs, in this order: llama-bench pp512, strata pp512, llama-bench tg32, strata tg32,
so both engines see the same slowly varying load. Every measurement is printed as one JSON line
(engine, test, threads, tok/s, the 1-minute load average before it); the last line is a summary
with the median of each engine and the ratio strata / llama.cpp per test.

  bench/compare_llama.py --model /tmp/perf/q3n-12l.gguf --strata build/strata \
      --llama-bench /path/to/llama.cpp/build/bin/llama-bench --threads 2 --rounds 3

strata's prefill figure is the `prefill tok/s` of its telemetry line for a raw prompt of exactly
--prompt-tokens tokens (built from a fixed word list and checked with `strata tokenize`); its
decode figure is the `decode tok/s` of a one-word prompt generating --gen-tokens greedy tokens
(llama-bench's tg test also starts from an empty context). llama-bench runs one repetition per
call (-r 1) after its own warm-up.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

WORDS = ["the", "model", "runs", "fast", "on", "cpu", "with", "experts", "and", "memory",
         "bandwidth", "token", "prefill", "decode", "layer", "attention"]


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def count_tokens(strata, model, text):
    out = subprocess.run([strata, "tokenize", "-m", model, text], check=True,
                         capture_output=True, text=True).stdout
    return len([t for t in re.split(r"[,\s]+", out) if t])


def make_prompt(strata, model, n_tokens):
    """A deterministic text of exactly n_tokens tokens: words, then a few letters to fill."""
    words = [WORDS[(i * 7 + i // 3) % len(WORDS)] for i in range(4 * n_tokens)]
    lo, hi = 1, len(words)
    while lo < hi:  # most words whose text stays within n_tokens
        mid = (lo + hi + 1) // 2
        if count_tokens(strata, model, " ".join(words[:mid])) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    for tail in ["", " a", " ab", " x y", " a b c", " ab ab"]:
        if count_tokens(strata, model, text + tail) == n_tokens:
            return text + tail
    sys.exit(f"could not build a prompt of exactly {n_tokens} tokens")


def run_strata(args, prompt, gen):
    cmd = [args.strata, "run", "-m", args.model, "--raw", "-p", prompt, "--max-tokens", str(gen),
           "--threads", str(args.threads)]
    err = subprocess.run(cmd, check=True, capture_output=True, text=True)
    line = [l for l in (err.stdout + err.stderr).splitlines() if l.startswith("[strata] prompt")]
    if not line:
        sys.exit("no telemetry line from strata run")
    prefill = re.search(r"prefill ([\d.]+) tok/s", line[-1])
    decode = re.search(r"decode ([\d.]+) tok/s", line[-1])
    return (float(prefill.group(1)) if prefill else None,
            float(decode.group(1)) if decode else None)


def run_llama(args, p, n):
    cmd = [args.llama_bench, "-m", args.model, "-t", str(args.threads), "-p", str(p), "-n", str(n),
           "-r", "1", "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--strata", required=True, help="the strata binary")
    ap.add_argument("--llama-bench", required=True, help="llama.cpp's llama-bench binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--tests", default="pp,tg", help="pp, tg or both (comma-separated)")
    args = ap.parse_args()
    tests = args.tests.split(",")
    prompt = make_prompt(args.strata, args.model, args.prompt_tokens) if "pp" in tests else ""
    pp_name, tg_name = f"pp{args.prompt_tokens}", f"tg{args.gen_tokens}"
    results = {}

    def record(engine, test, fn):
        load = load1()
        tok_s = fn()
        results.setdefault((engine, test), []).append(tok_s)
        print(json.dumps({"engine": engine, "test": test, "threads": args.threads,
                          "tok_s": tok_s, "load1": load}), flush=True)

    for _ in range(args.rounds):
        if "pp" in tests:
            record("llama.cpp", pp_name, lambda: run_llama(args, args.prompt_tokens, 0))
            record("strata", pp_name, lambda: run_strata(args, prompt, 2)[0])
        if "tg" in tests:
            record("llama.cpp", tg_name, lambda: run_llama(args, 0, args.gen_tokens))
            record("strata", tg_name, lambda: run_strata(args, "hello", args.gen_tokens)[1])

    summary = {"summary": True, "threads": args.threads, "rounds": args.rounds,
               "model": os.path.basename(args.model)}
    for test in [t for t in (pp_name, tg_name) if ("strata", t) in results]:
        s = statistics.median(results[("strata", test)])
        l = statistics.median(results[("llama.cpp", test)])
        summary[test] = {"strata": s, "llama.cpp": l, "ratio": s / l}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
