"""Serves timed calls of another checkout's `sampler.generate`: the "old path" of
`benchmarks/rollout_engine.py --baseline-tree DIR` (the engine's raw tokens/s against the path it
replaced, which no longer exists in this tree).

`DIR` is a checkout of horizon (e.g. `git worktree add /tmp/pre24 e23df6f^`, the tree before
the rollout engine). This script imports *that* tree's `horizon` and only the APIs every
checkout since the multi-token sampler has (`utils.config.load_config_file`, `model.params.numpy_init`,
`rl.rollout.sampler.generate` / `sampler_kwargs_from_config`; the module is `horizon.rl.rollout.sampler` in
trees of that era): configs/tiny.py's model with
configs/rl_tiny.py's `rl.sampler` section of that tree, i.e. how `make run` sampled there.

Protocol (one process per benchmark run, so the caller can interleave its own timed repetitions with
these on the same machine state): it prints one JSON line ``{"rev", "sampler"}``, then for every line
read from stdin (the path of an .npz of ``p{j}`` int32 prompt arrays, written by the caller) samples
`--new` tokens for those prompts and prints ``{"s": seconds}``; it exits at end of input.

    python benchmarks/generate_at_tree.py --tree /tmp/pre24 --new 64 < paths
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, help="a horizon checkout whose generate is timed")
    ap.add_argument("--new", type=int, required=True, help="sampled tokens per prompt")
    args = ap.parse_args(argv)
    tree = os.path.abspath(args.tree)
    if not os.path.isfile(os.path.join(tree, "src", "horizon", "rl", "rollout", "sampler.py")):
        ap.error(f"{tree} is not a horizon checkout with src/horizon/inference/sampler.py")
    if args.new < 1:
        ap.error("--new must be >= 1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.join(tree, "src"))
    import jax
    import ml_collections
    import numpy as np

    from horizon.model.params import numpy_init
    sampler = importlib.import_module("horizon.rl.rollout.sampler")     # the layout of the trees it times
    from horizon.utils.config import load_config_file

    c = load_config_file(os.path.join(tree, "configs", "rl_tiny.py"))
    c.model = load_config_file(os.path.join(tree, "configs", "tiny.py")).model
    params = numpy_init(ml_collections.FrozenConfigDict(c.model), 0)
    kw = sampler.sampler_kwargs_from_config(c)
    rev = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    print(json.dumps({"rev": rev or "?", "sampler": kw}), flush=True)
    for line in sys.stdin:
        z = np.load(line.strip())
        prompts = [z[f"p{j}"] for j in range(len(z.files))]
        t = time.perf_counter()
        sampler.generate(params, prompts, jax.random.key(1), cfg=c, max_new_tokens=args.new, stop_tokens=(), **kw)
        print(json.dumps({"s": time.perf_counter() - t}), flush=True)     # generate returns host arrays


if __name__ == "__main__":
    main()
