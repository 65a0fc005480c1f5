"""Serve a horizon checkpoint through the OpenAI-compatible API (docs/SERVING.md).

    python experiments/serve.py --config=configs/serve_tiny.py --config.serve.port=8000
    python experiments/serve.py --config=configs/serve_tiny.py --config.serve.checkpoint=runs/rl_tiny/sft

Then any OpenAI client works against http://127.0.0.1:8000/v1 (`/v1/models`, `/v1/completions`,
`/v1/chat/completions`, streaming, `logprobs`, `seed`); `POST /admin/load {"version": V}` with
`Authorization: Bearer $HORIZON_ADMIN_TOKEN` swaps in weight version V published by an RL run
(`rl.runtime.weight_sync`). Every request goes through the rollout engine's continuous batching.
"""

from __future__ import annotations

import os
import pathlib
import sys
import threading

import uvicorn

from horizon.data.tokenizer import tokenizer_from_config
from horizon.eval import load_params
from horizon.inference import warmup
from horizon.inference.config import engine_config
from horizon.inference.remote import ADMIN_TOKEN_ENV
from horizon.inference.server import make_app, validate_serve_config
from horizon.inference.service import EngineService
from horizon.model import hf
from horizon.rl.runtime import remote
from horizon.rl.runtime.weight_sync import WeightReceiver
from horizon.utils import cli, compiles
from horizon.utils.progress import progress


def checkpoint_dir(c) -> str:
    """`serve.checkpoint`, with "auto" = make run's newest checkpoint (RL, then SFT), else the init."""
    if c.serve.checkpoint != "auto":
        return c.serve.checkpoint
    out = pathlib.Path(c.exp.out_dir)
    return next((str(out / d) for d in ("ckpt", "sft") if (out / d).is_dir()), "")


def weight_loader(c, template):
    """`/admin/load`'s reader: version v of the run's published weights, shaped like `template`."""
    directory = c.serve.weights_dir or remote.weights_dir(c)
    lock = threading.Lock()

    def load(version: int):
        with lock:                           # a receiver rebuilds deltas from its own base: one at a time
            return WeightReceiver(directory).load(template, version)[0]
    return load, directory


def main(argv=None) -> None:
    c = cli.load(argv, default="configs/serve_tiny.py", validate=validate_serve_config, doc=__doc__,
                 derive=hf.apply_init_from)
    ckpt = checkpoint_dir(c)
    params, meta = load_params(ckpt, c)
    tok = tokenizer_from_config(c)
    compiles.use_persistent_cache(str(c.exp.get("compilation_cache_dir", "") or ""))
    n = len(warmup.plan(engine_config(c)).calls()) if c.serve.warmup else 0
    bar = progress(total=n, desc="serve warm-up", unit="shape")
    service = EngineService(c, params, version=int(meta.get("step", 0)), warm=bool(c.serve.warmup),
                            on_warm=lambda: bar.update(1))
    bar.close()
    load, directory = weight_loader(c, params)
    token = c.serve.admin_token or os.environ.get(ADMIN_TOKEN_ENV, "")
    app = make_app(service, tok, model_id=c.serve.model_id, max_len=engine_config(c).max_len,
                   vocab=int(c.model.vocab_size), admin_token=token, load_version=load, weights_dir=directory,
                   seed=int(c.serve.seed))
    print(f"serving {meta.get('source', ckpt or 'init')} (step {meta.get('step', 0)}) as {c.serve.model_id!r} at "
          f"http://{c.serve.host}:{c.serve.port}/v1; /admin/load "
          f"{'reads ' + directory if token else 'is off (no serve.admin_token / $' + ADMIN_TOKEN_ENV + ')'}",
          flush=True)
    try:
        uvicorn.run(app, host=c.serve.host, port=int(c.serve.port), log_level=c.serve.log_level)
    finally:
        service.close()


if __name__ == "__main__":
    main(sys.argv[1:])
