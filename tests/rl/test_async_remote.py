"""The async runtime's rollout workers sampling through an OpenAI-compatible server (docs/SERVING.md,
"Async RL"): the Ray pool's two workers ask one in-process server to load each version the trainer
publishes (`/admin/load`), every trained token carries the version the server sampled it with, and a
group sampled by one version has the log-probs that version's published weights give."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.data.tokenizer import ByteTokenizer
from horizon.inference.config import engine_config
from horizon.inference.remote import ADMIN_TOKEN_ENV
from horizon.inference.server import make_app, serving
from horizon.inference.service import EngineService
from horizon.model import transformer
from horizon.model.params import numpy_init
from horizon.rl.algo import trainer
from horizon.rl.runtime import checks, orchestrator, storage
from horizon.rl.runtime import weight_sync as ws
from horizon.utils.config import ConfigError, load_config_file

TOK = ByteTokenizer()
ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "async-admin-token"
STEPS = 3


def _cfg(run_dir: pathlib.Path, url: str):
    c = load_config_file(ROOT / "configs" / "rl_async.py")
    c.model.num_layers = 2
    c.model.d_model = 32
    c.rl.group_size = 2
    c.async_.toy_max_new_tokens = 16
    c.async_.update(max_staleness=1, num_rollout_workers=2, publish_dtype="float32", poll_s=0.02,
                    run_dir=str(run_dir), compare=("async",))
    c.exp.compilation_cache_dir = str(ROOT / "runs" / "jax_cache")
    c.rl.sampler.backend = "remote"
    c.rl.sampler.base_url = url + "/v1"
    return c


@pytest.mark.slow       # ~45 s alone on 2 cores: Ray, a trainer and two rollout actors
def test_async_workers_sample_through_a_server(tmp_path, monkeypatch):
    monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
    run_dir = tmp_path / "runs"
    weights = run_dir / "async" / "weights"            # where the async loop's trainer publishes
    c0 = _cfg(run_dir, "http://unused")
    template = numpy_init(c0.model, 0)
    svc = EngineService(c0, template, version=0)
    loads = []

    def load(v):
        loads.append(v)
        return ws.WeightReceiver(weights).load(template, v)[0]
    app = make_app(svc, TOK, model_id="m", max_len=engine_config(c0).max_len, vocab=int(c0.model.vocab_size),
                   admin_token=TOKEN, load_version=load, weights_dir=str(weights))
    try:
        with serving(app) as url:
            c = _cfg(run_dir, url)
            bad = _cfg(run_dir, url)
            bad.async_.compare = ("async", "sync")
            with pytest.raises(ConfigError, match="async_.compare"):
                checks.validate_async(bad)
            other = _cfg(tmp_path / "elsewhere", url)
            with pytest.raises(ConfigError, match="the server loads weights from"):
                checks.validate_async(other)                  # the server reads another run's store
            checks.validate_async(c)                          # probes the server: answers, token, one store
            res = orchestrator.Orchestrator(c, run_dir / "async", num_steps=STEPS).run()
    finally:
        svc.close()
    assert res["worker_restarts"] == 0
    store = storage.GroupStore(run_dir / "async" / "groups")
    slots = store.ready_slots()
    assert slots == list(range(STEPS * int(c.rl.prompts_per_step)))
    recs = [store.get(s) for s in slots]
    assert loads and set(loads) <= set(range(STEPS + 1))       # the workers asked for published versions only
    assert max(r.max_version for r in recs) >= 1               # and sampled with a trained one
    hist = orchestrator.summarize(run_dir / "async")["staleness_hist"]
    assert hist and min(hist) >= 0 and max(hist) <= 1
    # a group sampled by one version: the server's log-probs are that version's (f32 weights)
    fwd = jax.jit(functools.partial(transformer.forward, cfg=c.model))
    checked = 0
    for r in recs:
        if r.min_version != r.max_version:
            continue
        params = ws.WeightReceiver(weights).load(template, r.min_version)[0]
        for t in r.trajectories:
            seg = t.segments[0]
            logits, _ = fwd(params, jnp.asarray(seg.tokens[None], jnp.int32))
            lp = np.asarray(trainer.token_logprobs(logits, jnp.asarray(seg.tokens[None], jnp.int32))[0][0])
            m = seg.loss_mask
            # engine decode vs the training forward in f32: summation orders differ (docs/SERVING.md)
            np.testing.assert_allclose(seg.logprobs[m], lp[m], atol=2e-4)
            assert (seg.policy_versions[m] == r.min_version).all()
        checked += 1
    assert checked >= 1
