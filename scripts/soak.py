#!/usr/bin/env python3
"""Soak test of `strata serve` on loopback (issue 14; docs/RELIABILITY.md).

Starts the server on a tiny synthetic model, then keeps 4x --queue clients busy until --requests
requests have been answered: chat and completion requests, streamed or not, and a tenth of all
requests streamed and hung up after their first event. It checks, and prints as one JSON line:

  - every answer is 200 or 429 (the queue was full), apart from the hang-ups;
  - the server's RSS grows less than 5% from the 1,000th answer to the last;
  - its open file descriptors, counted while it is idle, are the same after the run as before it;
  - the last request's output equals the first identical request's (greedy, fixed seed).

Python 3 standard library only. Usage:
  nice -n 19 python3 scripts/soak.py --strata build/strata [--requests 10000]
Exit status 0 when every check holds.
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PROBE = {"model": "tiny", "messages": [{"role": "user", "content": "Name three colours."}],
         "max_tokens": 12, "temperature": 0, "seed": 7}


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Soak:
    def __init__(self, port, pid, total, seed):
        self.port, self.pid, self.total = port, pid, total
        self.lock = threading.Lock()
        self.started = 0
        self.answered = 0
        self.statuses = {}
        self.hangups = 0
        self.errors = []
        self.rng = random.Random(seed)
        self.local = threading.local()  # each client's own back-off generator
        self.marks = {}  # answered count -> (rss KiB, fds)

    def next_request(self):
        with self.lock:
            if self.started >= self.total:
                return None
            self.started += 1
            kind = "chat" if self.rng.random() < 0.5 else "completion"
            hang_up = self.rng.random() < 0.1
            stream = hang_up or self.rng.random() < 0.5
            tokens = self.rng.randint(1, 8)
            return kind, stream, hang_up, tokens

    def record(self, status):
        with self.lock:
            if status is None:
                self.hangups += 1
            else:
                self.statuses[status] = self.statuses.get(status, 0) + 1
            self.answered += 1
            n = self.answered
            if n % 250 == 0 or n == self.total:
                self.marks[n] = (rss_kib(self.pid), open_fds(self.pid))

    def one(self, kind, stream, hang_up, tokens):
        if kind == "chat":
            path = "/v1/chat/completions"
            body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story."}],
                    "max_tokens": tokens, "stream": stream, "temperature": 1}
        else:
            path = "/v1/completions"
            body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": tokens,
                    "stream": stream, "temperature": 1}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            res = conn.getresponse()
            if hang_up and res.status == 200:
                res.readline()  # the first event's first line, then hang up mid-stream
                conn.sock.shutdown(socket.SHUT_RDWR)
                self.record(None)
                return
            res.read()
            self.record(res.status)
            if res.status == 429:
                # Back off a little (Retry-After says 1 s; a busy client retries sooner), so
                # the load is a mix of served and refused requests, not a stream of 429s.
                time.sleep(self.backoff_rng().uniform(0.05, 0.2))
        except (OSError, http.client.HTTPException) as e:
            with self.lock:
                self.errors.append(f"{kind} stream={stream}: {e!r}")
            self.record(-1)
        finally:
            conn.close()

    def backoff_rng(self):
        if not hasattr(self.local, "rng"):
            with self.lock:
                self.local.rng = random.Random(self.rng.random())
        return self.local.rng

    def client(self):
        while True:
            job = self.next_request()
            if job is None:
                return
            self.one(*job)


def probe(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(PROBE), {"Content-Type": "application/json"})
    res = conn.getresponse()
    body = json.loads(res.read())
    conn.close()
    return res.status, body["choices"][0]["message"]["content"]


def wait_idle(port):
    """Until /metrics says nothing runs or waits (the server's fds are then only its own)."""
    for _ in range(600):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        running = re.search(r"^strata_generation_running (\S+)$", text, re.M)
        depth = re.search(r"^strata_queue_depth (\S+)$", text, re.M)
        if running and depth and float(running.group(1)) == 0 and float(depth.group(1)) == 0:
            time.sleep(2)  # keep-alive connections of the last clients close (1 s timeout)
            return
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/strata")
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--queue", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="strata-soak-")
    model = os.path.join(work, "tiny.gguf")
    subprocess.run([args.strata, "synth", "--arch", "qwen35moe", "--preset", "tiny", "--seed", "11",
                    "-o", model, "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    server = subprocess.Popen([args.strata, "serve", "-m", model, "--port", "0",
                               "--queue", str(args.queue), "--parallel", str(args.parallel),
                               "--threads", str(args.threads), "--ctx", "512"],
                              stderr=subprocess.PIPE, text=True)
    port = None
    for line in server.stderr:
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("soak: the server did not start")
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()

    status, first = probe(port)
    if status != 200:
        sys.exit(f"soak: the probe request got {status}")
    wait_idle(port)
    start_fds = open_fds(server.pid)
    soak = Soak(port, server.pid, args.requests, args.seed)
    clients = 4 * args.queue
    start = time.time()
    threads = [threading.Thread(target=soak.client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - start
    wait_idle(port)
    end_fds = open_fds(server.pid)
    status, last = probe(port)

    server.send_signal(signal.SIGTERM)
    server.wait(timeout=120)
    shutil.rmtree(work)

    # RSS under load at the 1,000th answer (or the first sample, in a shorter run) and after.
    marks = sorted(soak.marks.items())
    base_n, (base_rss, _) = next(((n, m) for n, m in marks if n >= min(1000, args.requests)), marks[0])
    later = [rss for n, (rss, _) in marks if n >= base_n]
    growth = (max(later) - base_rss) / base_rss
    others = {s: n for s, n in soak.statuses.items() if s not in (200, 429)}
    report = {
        "requests": soak.answered, "clients": clients, "queue": args.queue, "parallel": args.parallel,
        "seconds": round(elapsed, 1), "statuses": soak.statuses, "hangups": soak.hangups,
        "errors": soak.errors[:5], "rss_kib_baseline": base_rss, "rss_baseline_at": base_n,
        "rss_kib_max_after": max(later), "rss_growth": round(growth, 4),
        "fds_idle_start": start_fds, "fds_idle_end": end_fds,
        "rss_kib_samples": [rss for _, (rss, _) in marks],
        "fds_under_load": [fds for _, (_, fds) in marks],
        "probe_equal": first == last, "server_exit": server.returncode,
    }
    ok = (not others and not soak.errors and growth < 0.05 and first == last and
          start_fds == end_fds and server.returncode == 0 and soak.answered == args.requests)
    report["ok"] = ok
    print(json.dumps(report))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
