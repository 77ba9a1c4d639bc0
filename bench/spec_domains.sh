#!/usr/bin/env bash
# The forced-continuation benchmark of speculative decoding (docs/SPECULATION.md, "Measuring it
# honestly") on three domains of real text from this repository:
#   code   the project's C++ sources (src/decode, src/spec)
#   tools  the JSON of the server's and tool-call parser's tests (raw string literals)
#   prose  the docs
# For each domain it runs `strata bench --continue-from` with speculation off, at fixed depths
# 1..4 (suffix drafter), and with SpecGate choosing (auto); with --mtp-acceptance P also MTP at
# the knob. Prints one JSON object per run (a line each: domain, mode, depth, decode tok/s, tokens
# per window, acceptance by position, T(1), T(n)/T(1)).
# Usage: bench/spec_domains.sh MODEL [--mtp-acceptance 0.85] [strata bench flags...]
# The model should carry the real Qwen vocabulary (strata synth --tokenizer-json tokenizer.json)
# so the texts tokenize as they would for a real model. Run it only on a quiet machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
strata="${STRATA:-$root/build/strata}"
model="$1"; shift
knob=""
if [[ "${1:-}" == "--mtp-acceptance" ]]; then knob="$2"; shift 2; fi
work="${SPEC_DOMAINS_DIR:-$root/build/spec-domains}"
mkdir -p "$work"
cat "$root"/src/decode/*.cpp "$root"/src/spec/*.cpp > "$work/code.txt"
# Raw string literals R"(...)" of the tool-call and server tests: the JSON they send and expect.
perl -0777 -ne 'while (/R"\((.*?)\)"/sg) { print "$1\n"; }' \
  "$root"/tests/test_tool_calls.cpp "$root"/tests/test_server*.cpp > "$work/tools.txt"
cat "$root"/docs/*.md > "$work/prose.txt"

prompt=${PROMPT_TOKENS:-256}
gen=${GEN_TOKENS:-256}
for domain in code tools prose; do
  run() {
    local label="$1"; shift
    "$strata" bench -m "$model" --continue-from "$work/$domain.txt" --prompt-tokens "$prompt" \
      --gen-tokens "$gen" "$@" | python3 -c '
import json, sys
j = json.load(sys.stdin); s = j["spec"]
print(json.dumps({"domain": sys.argv[1], "run": sys.argv[2], "decode_tok_per_s": round(j["decode"]["tok_per_s"], 3),
  "windows": j["decode"]["windows"], "tokens_per_window": s.get("tokens_per_window"),
  "acceptance": [round(a["acceptance"], 3) for a in s.get("acceptance_by_position", [])],
  "t1_ms": s.get("t1_ms"), "t_ratio": s.get("t_ratio"), "rollback_ms": s.get("rollback_ms"),
  "snapshot_ms": s.get("snapshot_ms"), "draft_ms": s.get("draft_ms"), "knob": s.get("mtp_acceptance_knob")}))' "$domain" "$label"
  }
  run off --spec off "$@"
  for d in 1 2 3 4; do run "suffix-depth-$d" --spec suffix --spec-depth "$d" "$@"; done
  run auto --spec auto "$@"
  if [[ -n "$knob" ]]; then
    for d in 1 2 3; do run "mtp-knob-depth-$d" --spec mtp --spec-depth "$d" --mtp-acceptance "$knob" "$@"; done
    run mtp-knob-auto --spec auto --mtp-acceptance "$knob" "$@"
  fi
done
