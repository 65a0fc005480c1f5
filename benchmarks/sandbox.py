"""Sandbox action latency, episode overhead and throughput: the in-box executor against one
`docker exec` per action, same image and limits, in the same run (docs/SANDBOX.md "Measuring").

Reported for each path (`--executor`, default inbox, and `--baseline`, default docker-exec), with
the ratio baseline / executor:

* per-action latency p50 / p95 on one box: `true`, a 4 KiB write_file + read_file, a command
  printing 100 KiB, `prepare()`, and make run's task reset after prepare (two actions) or inside
  it (one action, `prepare(reset=...)`);
* episode overhead: prepare + make run's task reset + one tool call + the verifier (the
  executor with the reset inside prepare, docker-exec after it, as each path runs in a rollout);
* `true` actions/s over `--boxes` (default 8 and 32) boxes, one client thread per box;
* box starts per second from a warm image (`--starts` boxes created by as many threads);
* a `--episode`-action scripted episode (shell commands, reads, edits, test runs) on one box:
  wall time per action and, for the executor, the overhead per action = host time minus the
  in-box run time the executor reports (`horizon.sandbox.base.ActionMeter`).

Samples of the two paths are interleaved (executor, baseline, executor, ...) so load drifts hit
both alike. Run it with nothing else on the machine.

    .venv/bin/python benchmarks/sandbox.py [--n 200 --boxes 8 32 --actions 100 --starts 16 --episode 200]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from horizon.env.families import check_reset, family_from_config  # noqa: E402
from horizon.sandbox.base import WORKSPACE, meter_of  # noqa: E402
from horizon.sandbox.docker import DockerSandbox  # noqa: E402
from horizon.tasks import verify  # noqa: E402
from horizon.utils import progress, provenance  # noqa: E402
from horizon.utils.config import load_config_file  # noqa: E402

LIMITS = dict(cpus=1.0, mem_limit="512m", max_output_bytes=256 * 1024)
FAMILY = family_from_config(load_config_file(str(ROOT / "configs" / "rl_tiny.py")).exp)   # make run's
TASK = FAMILY.make_task(0)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _box(executor: str, image: str | None) -> DockerSandbox:
    sb = DockerSandbox.create(image, executor=executor, **LIMITS)
    if sb.executor != executor:
        raise SystemExit(f"image {sb.image!r} gave executor {sb.executor!r}, not {executor!r}")
    return sb


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _actions(sb) -> dict:
    blob = b"x" * 4096

    def true():
        assert sb.exec("true").ok

    def write_read():
        sb.write_file(f"{WORKSPACE}/blob.bin", blob)
        assert sb.read_file(f"{WORKSPACE}/blob.bin") == blob

    def out100k():
        r = sb.exec("head -c 102400 /dev/zero | tr '\\0' x")
        assert r.ok and len(r.output) == 102400, (r.exit_code, len(r.output))

    step = FAMILY.reset_step(TASK)

    def prepare_then_reset():   # two actions, as before the combined step
        sb.prepare()
        check_reset(step.run(sb), TASK)

    def prepare_with_reset():   # one action
        check_reset(sb.prepare(step.command, workdir=step.workdir, timeout=step.timeout), TASK)

    return {"true": true, "write 4 KiB + read": write_read, "100 KiB output": out100k, "prepare": sb.prepare,
            "prepare, then reset": prepare_then_reset, "prepare+reset (1 action)": prepare_with_reset}


def latency(paths: dict[str, DockerSandbox], n: int) -> dict:
    """p50 / p95 seconds per action kind and path, samples interleaved across paths."""
    acts = {p: _actions(sb) for p, sb in paths.items()}
    out = {}
    for kind in acts[next(iter(paths))]:
        xs = {p: [] for p in paths}
        for _ in progress.progress(range(n), desc=f"latency: {kind}", unit="round"):
            for p in paths:
                xs[p].append(_time(acts[p][kind]))
        out[kind] = {p: dict(p50=statistics.median(v), p95=_pct(v, 0.95)) for p, v in xs.items()}
    return out


def episode_overhead(paths: dict[str, DockerSandbox], n: int) -> dict:
    """Seconds of prepare + reset + one tool call + verify of make run's task family, per path
    (median over n rounds): the executor resets inside prepare's action, docker-exec after it."""
    step = FAMILY.reset_step(TASK)
    xs = {p: [] for p in paths}

    def one(sb):
        if sb.executor == "inbox":
            check_reset(sb.prepare(step.command, workdir=step.workdir, timeout=step.timeout), TASK)
        else:
            sb.prepare()
            check_reset(step.run(sb), TASK)
        assert sb.exec(f"cat {WORKSPACE}/*.py | head -n 5").ok
        verify(TASK, sb, "", timeout=60)

    for _ in progress.progress(range(n), desc="episode overhead", unit="round"):
        for p, sb in paths.items():
            xs[p].append(_time(lambda sb=sb: one(sb)))
    return {p: dict(p50=statistics.median(v), p95=_pct(v, 0.95)) for p, v in xs.items()}


def throughput(executor: str, image: str | None, boxes: int, actions: int) -> float:
    """`true` actions/s with `boxes` boxes, one client thread each."""
    with ThreadPoolExecutor(boxes) as ex:
        sbs = list(ex.map(lambda _: _box(executor, image), range(boxes)))
        try:
            go = threading.Barrier(boxes + 1)

            def work(sb):
                go.wait()
                for _ in range(actions):
                    assert sb.exec("true").ok

            futs = [ex.submit(work, sb) for sb in sbs]
            go.wait()
            t0 = time.perf_counter()
            for f in futs:
                f.result()
            return boxes * actions / (time.perf_counter() - t0)
        finally:
            list(ex.map(lambda sb: sb.close(), sbs))


def starts(executor: str, image: str | None, n: int) -> float:
    """Boxes started per second (n at once, n threads), from a warm image; removal not counted."""
    with ThreadPoolExecutor(n) as ex:
        t0 = time.perf_counter()
        sbs = list(ex.map(lambda _: _box(executor, image), range(n)))
        rate = n / (time.perf_counter() - t0)
        list(ex.map(lambda sb: sb.close(), sbs))
    return rate


def scripted_episode(sb: DockerSandbox, n: int) -> dict:
    """`n` actions of a coding episode (shell, reads, edits, test runs) on one box: wall seconds per
    action, and host time minus in-box run time per action (the executor reports the latter)."""
    sb.prepare()
    sb.exec(f"find {WORKSPACE} -mindepth 1 -delete")
    sb.write_file(f"{WORKSPACE}/calc.py", "def add(a, b):\n    return a + b\n")
    sb.write_file(f"{WORKSPACE}/test_calc.py", "from calc import add\nassert add(2, 3) == 5\nprint('ok')\n")
    steps = [
        lambda i: sb.exec("ls -la && grep -n 'def ' *.py"),
        lambda i: sb.read_file(f"{WORKSPACE}/calc.py"),
        lambda i: sb.write_file(f"{WORKSPACE}/calc.py", f"def add(a, b):\n    return a + b  # v{i}\n"),
        lambda i: sb.exec("python3 test_calc.py"),
        lambda i: sb.exec(f"sed -n 1,2p calc.py; echo step {i} >> log.txt"),
    ]
    m = meter_of(sb)
    a0, s0, in0 = m.actions, m.seconds, m.inbox_s
    t0 = time.perf_counter()
    for i in progress.progress(range(n), desc=f"scripted episode ({sb.executor})", unit="action"):
        steps[i % len(steps)](i)
    wall = time.perf_counter() - t0
    k = m.actions - a0
    out = dict(actions=k, wall_per_action=wall / k, sandbox_per_action=(m.seconds - s0) / k)
    if sb.executor == "inbox":
        out["overhead_per_action"] = (m.seconds - s0 - (m.inbox_s - in0)) / k
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=None, help="image (default HORIZON_BASE_IMAGE)")
    ap.add_argument("--executor", default="inbox", choices=["inbox", "docker-exec"])
    ap.add_argument("--baseline", default="docker-exec", choices=["inbox", "docker-exec", "none"])
    ap.add_argument("--n", type=int, default=200, help="samples per action kind")
    ap.add_argument("--episodes", type=int, default=20, help="episode-overhead rounds")
    ap.add_argument("--boxes", type=int, nargs="+", default=[8, 32], help="box counts for actions/s")
    ap.add_argument("--actions", type=int, default=100, help="`true` actions per box for actions/s")
    ap.add_argument("--starts", type=int, default=16, help="boxes started at once for starts/s")
    ap.add_argument("--episode", type=int, default=200, help="actions of the scripted episode")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    prov = provenance.announce(config=vars(args))
    names = [args.executor] + ([args.baseline] if args.baseline not in ("none", args.executor) else [])
    _box(names[0], args.image).close()   # warm-up: client pool, image in the page cache
    res: dict = {"provenance": prov.fields()}
    paths = {p: _box(p, args.image) for p in names}
    try:
        res["latency"] = latency(paths, args.n)
        res["episode"] = episode_overhead(paths, args.episodes)
        res["scripted"] = {p: scripted_episode(sb, args.episode) for p, sb in paths.items()}
    finally:
        for sb in paths.values():
            sb.close()
    res["actions_per_s"] = {str(b): {p: throughput(p, args.image, b, args.actions) for p in names}
                            for b in args.boxes}
    res["starts_per_s"] = {p: starts(p, args.image, args.starts) for p in names}
    _report(res, names)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


def _report(res: dict, names: list[str]) -> None:
    a, b = names[0], (names[1] if len(names) > 1 else None)
    ratio = (lambda x, y: f"  {y / x:6.1f}x") if b else (lambda x, y: "")
    print(f"\nper-action latency, one box (ms; ratio = {b} / {a}):" if b else "\nper-action latency (ms):")
    for kind, r in res["latency"].items():
        line = f"  {kind:<20} {a}: p50 {r[a]['p50'] * 1e3:7.2f} p95 {r[a]['p95'] * 1e3:7.2f}"
        if b:
            line += f"   {b}: p50 {r[b]['p50'] * 1e3:7.2f} p95 {r[b]['p95'] * 1e3:7.2f}"
            line += ratio(r[a]["p50"], r[b]["p50"])
        print(line)
    e = res["episode"]
    print(f"episode overhead (prepare + reset + tool call + verify), p50 ms: {a} {e[a]['p50'] * 1e3:.1f}"
          + (f", {b} {e[b]['p50'] * 1e3:.1f}{ratio(e[a]['p50'], e[b]['p50'])}" if b else ""))
    for p, s in res["scripted"].items():
        extra = (f", overhead (host - in-box run time) {s['overhead_per_action'] * 1e3:.2f} ms/action"
                 if "overhead_per_action" in s else "")
        print(f"scripted episode, {s['actions']} actions, {p}: {s['wall_per_action'] * 1e3:.2f} ms/action{extra}")
    for boxes, r in res["actions_per_s"].items():
        print(f"`true` actions/s over {boxes} boxes ({boxes} threads): {a} {r[a]:.0f}"
              + (f", {b} {r[b]:.0f}{ratio(r[b], r[a])}" if b else ""))
    s = res["starts_per_s"]
    print(f"box starts/s from a warm image: {a} {s[a]:.1f}" + (f", {b} {s[b]:.1f}" if b else ""))


if __name__ == "__main__":
    sys.exit(main())
