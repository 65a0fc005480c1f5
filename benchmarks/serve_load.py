"""The OpenAI-compatible server under load (docs/SERVING.md "Serve a checkpoint"): `--requests`
requests from `--clients` concurrent clients against experiments/serve.py started as its own process,
a mix of text and token-id completions, chat completions and streamed completions.

After an untimed warm-up of `--requests / 2` requests of the same mix (where the engine compiles its
shapes: which ones depends on how requests arrive together), prints failures,
requests/s and latency p50 / p95, the server's RSS after the first half and after
all requests (the growth between them: a leak shows here), and the served tokens/s against the same
engine driven in-process (`EngineService.generate`, the same requests, one batch) in the same run.

    .venv/bin/python benchmarks/serve_load.py [--requests 1000 --clients 16 --max-tokens 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from horizon.utils import provenance  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_server(port: int, config: str = "configs/serve_tiny.py") -> subprocess.Popen:
    """experiments/serve.py on `port` (the initialization: no checkpoint), ready when /v1/models answers."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "experiments" / "serve.py"), f"--config={config}",
                             f"--config.serve.port={port}", "--config.serve.checkpoint="], cwd=ROOT)
    t0 = time.time()
    while time.time() - t0 < 300:
        if proc.poll() is not None:
            raise RuntimeError(f"experiments/serve.py exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("experiments/serve.py did not answer within 300 s")


def request(client: httpx.Client, base: str, i: int, max_tokens: int) -> tuple[bool, float, int]:
    """Request i of the mix: (ok, seconds, generated tokens)."""
    kind = i % 4
    t0 = time.perf_counter()
    try:
        if kind == 2:
            r = client.post(f"{base}/chat/completions", json=dict(
                messages=[{"role": "user", "content": f"task {i}: set TIMEOUT"}], max_tokens=max_tokens, seed=i))
            body = r.json()
        elif kind == 3:
            with client.stream("POST", f"{base}/completions", json=dict(
                    prompt=f"def f{i}(x):", max_tokens=max_tokens, seed=i, stream=True)) as r:
                events = [line for line in r.iter_lines() if line.startswith("data: ")]
            ok = r.status_code == 200 and events[-1] == "data: [DONE]"
            toks = sum(len(json.loads(e[6:])["choices"][0]["horizon_token_ids"]) for e in events[:-1])
            return ok, time.perf_counter() - t0, toks
        else:
            prompt = f"settings {i}: TIMEOUT = 42" if kind == 0 else [int(b) for b in f"x{i} = 1".encode()]
            r = client.post(f"{base}/completions", json=dict(prompt=prompt, max_tokens=max_tokens, seed=i, logprobs=1))
            body = r.json()
        return r.status_code == 200, time.perf_counter() - t0, int(body["usage"]["completion_tokens"])
    except (httpx.HTTPError, KeyError, ValueError):
        return False, time.perf_counter() - t0, 0


def load(base: str, pid: int, n: int, clients: int, max_tokens: int) -> dict:
    """`n` requests over `clients` threads in two halves, the server's RSS after each."""
    out = {"requests": n, "clients": clients}
    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=clients)) as client, \
            ThreadPoolExecutor(clients) as pool:
        warm = list(pool.map(lambda i: request(client, base, i, max_tokens), range(n, n + n // 2)))
        out["warmup_failed"] = sum(not ok for ok, _, _ in warm)        # compiles happen here, untimed
        t0 = time.perf_counter()
        res = list(pool.map(lambda i: request(client, base, i, max_tokens), range(n // 2)))
        out["rss_half_mib"] = rss_mib(pid)
        res += list(pool.map(lambda i: request(client, base, i, max_tokens), range(n // 2, n)))
        out["wall_s"] = time.perf_counter() - t0
        out["rss_end_mib"] = rss_mib(pid)
    lat = sorted(s for _, s, _ in res)
    out.update(failed=sum(not ok for ok, _, _ in res), requests_per_s=n / out["wall_s"],
               tokens=sum(t for _, _, t in res), p50_s=statistics.median(lat), p95_s=lat[int(0.95 * (len(lat) - 1))])
    out["rss_growth_mib"] = out["rss_end_mib"] - out["rss_half_mib"]
    out["tokens_per_s"] = out["tokens"] / out["wall_s"]
    return out


def in_process_tokens_per_s(n: int, max_tokens: int) -> float:
    """The same engine in-process: `n` completions (token-id prompts of the mix's lengths) as one batch,
    after the same batch once with other seeds (the compiles)."""
    import numpy as np

    from horizon.inference import openai_api as api
    from horizon.inference.engine import Request
    from horizon.inference.service import EngineService
    from horizon.model import transformer
    from horizon.utils.config import load_config_file
    from horizon.utils.seeds import run_keys

    c = load_config_file(ROOT / "configs" / "serve_tiny.py")
    svc = EngineService(c, transformer.init(run_keys(c.seed)["init"], c.model))
    reqs = [Request(np.frombuffer(f"settings {i}: TIMEOUT = 42".encode(), np.uint8).astype(np.int32), api.seed_key(i),
                    max_tokens) for i in range(n)]
    svc.generate(reqs)                                       # compile outside the timing
    reqs = [dataclasses.replace(r, key=api.seed_key(n + i)) for i, r in enumerate(reqs)]
    t0 = time.perf_counter()
    toks = sum(len(c_.tokens) for c_ in svc.generate(reqs))
    dt = time.perf_counter() - t0
    svc.close()
    return toks / dt


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    provenance.announce(config=vars(args))
    port = free_port()
    proc = start_server(port)
    try:
        out = load(f"http://127.0.0.1:{port}/v1", proc.pid, args.requests, args.clients, args.max_tokens)
        auth = [httpx.post(f"http://127.0.0.1:{port}/admin/load", json={"version": 1}, headers=h).status_code
                for h in ({}, {"Authorization": "Bearer wrong"})]
        out["admin_without_or_wrong_token"] = auth
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out["in_process_tokens_per_s"] = in_process_tokens_per_s(256, args.max_tokens)
    out["served_vs_in_process"] = out["tokens_per_s"] / out["in_process_tokens_per_s"]
    print(f"{out['requests']} requests from {out['clients']} clients: {out['failed']} failed, "
          f"{out['requests_per_s']:.1f} req/s, latency p50 {out['p50_s'] * 1e3:.0f} ms p95 {out['p95_s'] * 1e3:.0f} ms")
    print(f"server RSS {out['rss_half_mib']:.1f} MiB after {out['requests'] // 2}, {out['rss_end_mib']:.1f} MiB after "
          f"{out['requests']} (growth {out['rss_growth_mib']:+.1f} MiB)")
    print(f"served {out['tokens_per_s']:.0f} tokens/s vs the engine in-process {out['in_process_tokens_per_s']:.0f} "
          f"tokens/s (one batch of 256): {out['served_vs_in_process']:.2f}x; /admin/load without / with a wrong "
          f"token: {auth}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
