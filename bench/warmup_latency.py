#!/usr/bin/env python3
"""First-token latency after idle, with and without the warm-up window (strata serve --warmup-after).

Starts `strata serve` on MODEL once per setting, and ROUNDS times: waits IDLE seconds with nothing
running, sends one streamed chat request and times the first content token (the time from sending
to the first `data:` event that carries text). Prints one JSON object per setting: the warm-up
threshold, the latencies in ms, their median, and the warm-up windows /metrics counted.

    bench/warmup_latency.py MODEL [--idle 35] [--rounds 3] [-- extra strata serve flags...]
Run it on a quiet machine (a busy one's noise is larger than what it measures on a CPU).
"""
import argparse, json, os, re, socket, statistics, subprocess, sys, time, http.client

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--idle", type=float, default=35.0)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--strata", default=os.environ.get("STRATA", os.path.join(root, "build", "strata")))
# (Everything after "--" goes to strata serve; a positional nargs="*" would be filled, empty, with
# the model and leave those flags unrecognized.)
a, extra = p.parse_known_args()
a.extra = extra[1:] if extra[:1] == ["--"] else extra


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_token_ms(port):
    body = json.dumps({"model": os.path.basename(a.model).removesuffix(".gguf"), "stream": True, "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": "Say something after a long pause."}]})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        # (The first chunk carries the role and an empty content: the token comes after it.)
        choices = json.loads(line[5:]).get("choices") or [{}]
        if choices[0].get("delta", {}).get("content"):
            ms = (time.perf_counter() - start) * 1e3
            r.read()
            c.close()
            return ms
    c.close()
    raise RuntimeError("no content token in the reply")


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    m = re.search(r"^" + name + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


for warmup in (a.idle - 5, 0):
    port = free_port()
    cmd = [a.strata, "serve", "-m", a.model, "--port", str(port), "--warmup-after", str(warmup)] + a.extra
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stderr:
            if "serving " in line:
                break
        latencies = []
        for _ in range(a.rounds):
            time.sleep(a.idle)
            latencies.append(round(first_token_ms(port), 2))
        print(json.dumps({"warmup_after_s": warmup, "idle_s": a.idle, "first_token_ms": latencies,
                          "median_ms": statistics.median(latencies),
                          "warmup_windows": metric(port, "strata_warmup_windows_total")}), flush=True)
    finally:
        server.terminate()
        server.wait()
