"""Serve `make run`'s policy through the OpenAI-compatible API (docs/SERVING.md).

    python experiments/serve.py --config=configs/serve_tiny.py --config.serve.port=8000

configs/rl_tiny.py's model, tokenizer and engine sizes (`rl.sampler.engine_*`), so every request is
sampled as the RL run samples its rollouts; `serve.checkpoint` picks the weights.
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "rl_tiny.py")
    c.serve = ml_collections.ConfigDict(dict(
        host="127.0.0.1",         # loopback by default: the server has no authentication beyond the admin token
        port=8000,
        checkpoint="auto",        # "auto": make run's newest of <exp.out_dir>/ckpt, then /sft, else the init;
        #                           a Checkpointer directory; "" = the initialization (model.init_from if set)
        model_id="horizon-tiny",  # the id /v1/models lists and requests name
        admin_token="",           # bearer token of /admin/load ("" = the route refuses every call); also read
        #                           from $HORIZON_ADMIN_TOKEN when empty, which keeps it out of config.json
        weights_dir="",           # published weight versions /admin/load reads (rl.runtime.weight_sync); "" =
        #                           where experiments/rl.py publishes them (rl.runtime.remote.weights_dir)
        seed=0,                   # seeds of requests that send none: a stream of draws from this
        warmup=False,             # compile every engine shape before serving (inference.warmup, a progress bar): on
        #                           2 CPU cores this engine's plan took over 5 minutes; the persistent cache
        #                           (exp.compilation_cache_dir) keeps them for later starts
        log_level="warning",      # uvicorn's
    ))
    return c
