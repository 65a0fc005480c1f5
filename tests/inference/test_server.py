"""The OpenAI-compatible server and the remote policy (docs/SERVING.md): the official `openai` client
against the server, served samples == the in-process engine's for the same seed, the remote policy ==
`EnginePolicy` (batched and streamed), 4xx on malformed requests with the server still serving, the
admin route's token and weight swap.

One server (configs/serve_tiny.py's model and engine, random weights) for the whole module."""

import concurrent.futures
import json
import os

import httpx
import jax
import ml_collections
import numpy as np
import openai
import pytest

from horizon.data.tokenizer import tokenizer_from_config
from horizon.inference import engine as E
from horizon.inference import openai_api as api
from horizon.inference import sampler
from horizon.inference.config import engine_config
from horizon.inference.policy import EnginePolicy, rollout_policy
from horizon.inference.remote import RemotePolicy, RemoteStream
from horizon.inference.server import make_app, serving, validate_serve_config
from horizon.inference.service import EngineService
from horizon.model.params import numpy_init
from horizon.rl.runtime.weight_sync import WeightPublisher, WeightReceiver
from horizon.utils.config import ConfigError, load_config_file

CFG = load_config_file("configs/serve_tiny.py")
TOK = tokenizer_from_config(CFG)
MODEL = "horizon-tiny"
TOKEN = "test-admin-token"
# Log-probs: the server's engine may reuse a cached prefix where the reference engine prefills it,
# which changes only the summation order (tests/rl/test_engine.py: observed ~1e-6); an off-by-one
# position or a stale cache row moves a log-prob by O(1).
ATOL = 1e-4


def _params(seed):
    return numpy_init(ml_collections.FrozenConfigDict(CFG.model), seed)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    weights = tmp_path_factory.mktemp("weights")
    pub = WeightPublisher(weights, dtype="float32")
    params0, params1 = _params(0), _params(1)
    pub.publish(params1, 1)
    pub.close()
    svc = EngineService(CFG, params0)
    app = make_app(svc, TOK, model_id=MODEL, max_len=engine_config(CFG).max_len, vocab=int(CFG.model.vocab_size),
                   admin_token=TOKEN, load_version=lambda v: WeightReceiver(weights).load(params0, v)[0],
                   weights_dir=str(weights))
    with serving(app) as url:
        yield dict(url=url, svc=svc, params=(params0, params1), weights=weights)
    svc.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused")


def _reference(params, prompt, seed, max_new, temperature=1.0):
    eng = E.Engine(CFG, params=params)
    return E.generate_requests(eng, [E.Request(np.asarray(prompt, np.int32), api.seed_key(seed), max_new, None,
                                               temperature, 1.0)])[0]


def test_openai_client_routes(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    a = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=24, seed=7, logprobs=1)
    b = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=24, seed=7, logprobs=1)
    c = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=24, seed=8, logprobs=1)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].logprobs.token_logprobs == b.choices[0].logprobs.token_logprobs
    assert a.choices[0].logprobs.token_logprobs != c.choices[0].logprobs.token_logprobs
    lp = a.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == a.usage.completion_tokens
    assert all(x <= 0 for x in lp.token_logprobs)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "be brief"},
                                                                  {"role": "user", "content": "hi"}],
                                          max_tokens=16, seed=3, logprobs=True)
    ch = chat.choices[0]
    assert ch.message.role == "assistant" and ch.finish_reason in ("stop", "length")
    assert len(ch.logprobs.content) == chat.usage.completion_tokens
    # streaming: the events put together are the unstreamed answer for the same seed
    # (100 tokens: several engine round-trips of `rl.sampler.sync_tokens`, one event each)
    whole = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=100, seed=7)
    parts = list(client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=100, seed=7, stream=True))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert sum(len(p.choices[0].horizon_token_ids) for p in parts) == whole.usage.completion_tokens
    assert len(parts) >= 2 or whole.usage.completion_tokens <= int(CFG.rl.sampler.sync_tokens)
    cparts = list(client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "be brief"},
                                                                         {"role": "user", "content": "hi"}],
                                                 max_tokens=16, seed=3, stream=True))
    assert "".join(p.choices[0].delta.content or "" for p in cparts) == ch.message.content


def test_served_equals_engine(server):
    params0 = server["params"][0]
    prompt = TOK.encode("read key.txt") + [TOK.end_turn_id]
    for seed in (0, 5, 2**40 + 3):
        r = httpx.post(server["url"] + "/v1/completions", json=dict(
            prompt=prompt, max_tokens=20, seed=seed, logprobs=1, return_tokens_as_token_ids=True,
            return_expert_ids=True), timeout=120).json()
        ch = r["choices"][0]
        ref = _reference(params0, prompt, seed, 20)
        np.testing.assert_array_equal(ch["horizon_token_ids"], ref.tokens)
        assert ch["logprobs"]["tokens"] == [f"token_id:{t}" for t in ref.tokens]
        np.testing.assert_allclose(ch["logprobs"]["token_logprobs"], ref.logprobs, rtol=0, atol=ATOL)
        np.testing.assert_array_equal(np.sort(np.transpose(ch["horizon_expert_ids"], (1, 0, 2)), -1),
                                      np.sort(ref.router_indices, -1))


def test_remote_policy_equals_engine_policy(server):
    key = jax.random.PRNGKey(11)
    params0 = server["params"][0]
    local = EnginePolicy(sampler.ParamsHolder(params0), CFG, key)
    remote = RemotePolicy(server["url"] + "/v1", key, model=MODEL, expert_ids=True)
    rng = np.random.default_rng(0)
    ctxs = [rng.integers(0, 256, size=int(n)).astype(np.int32) for n in (5, 17, 40)]
    for a, b in zip(local(ctxs, 16), remote(ctxs, 16)):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=ATOL)
        np.testing.assert_array_equal(np.sort(a.router_indices, -1), np.sort(b.router_indices, -1))
    streams = local.stream(), remote.stream()
    assert isinstance(streams[1], RemoteStream)
    got = []
    for st in streams:
        for e, ctx in enumerate(ctxs):
            st.submit(e, ctx, 12)
        out = {}
        while st.busy:
            out.update(dict(st.advance()))
        got.append(out)
    for e in range(len(ctxs)):
        np.testing.assert_array_equal(got[0][e].tokens, got[1][e].tokens)


def test_rollout_policy_picks_the_backend(server):
    c = ml_collections.ConfigDict(CFG.to_dict())
    c.rl.sampler.backend = "remote"
    c.rl.sampler.base_url = server["url"] + "/v1"
    pol = rollout_policy(sampler.ParamsHolder(server["params"][0]), c, jax.random.PRNGKey(0), temperature=0.5)
    assert isinstance(pol, RemotePolicy) and pol.temperature == 0.5
    assert isinstance(rollout_policy(sampler.ParamsHolder(server["params"][0]), CFG, jax.random.PRNGKey(0)),
                      EnginePolicy)


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (dict(prompt=""), 400, "prompt"),
    (dict(prompt=[1, 2, 10**6]), 400, "prompt"),
    (dict(prompt="x", temperature=-1), 400, "temperature"),
    (dict(prompt="x", max_tokens=10**6), 400, "max_tokens"),
    (dict(prompt="x", seed=-3), 400, "seed"),
    (dict(prompt="x", stop=["\n"]), 400, "stop"),
    (dict(prompt="x", model="gpt-4"), 404, "model"),
    ([1, 2], 400, None),
])
def test_malformed_requests_get_4xx_json(server, body, status, param):
    kw = dict(content=body) if isinstance(body, bytes) else dict(json=body)
    r = httpx.post(server["url"] + "/v1/completions", timeout=60, **kw)
    assert r.status_code == status and r.json()["error"]["param"] == param
    ok = httpx.post(server["url"] + "/v1/completions", json=dict(prompt="x", max_tokens=2), timeout=120)
    assert ok.status_code == 200                         # the server still serves


def test_chat_messages_validated(server):
    r = httpx.post(server["url"] + "/v1/chat/completions", json=dict(messages=[{"role": "wizard", "content": "x"}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"


def test_admin_load_token_and_swap(server):
    url = server["url"]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert httpx.post(url + "/admin/load", json={"version": 1}, headers=headers).status_code == 401
        assert httpx.get(url + "/admin/weights", headers=headers).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    store = httpx.get(url + "/admin/weights", headers=auth).json()
    assert store == {"object": "weights", "weights_dir": os.path.realpath(server["weights"]), "version": 0}
    assert httpx.post(url + "/admin/load", json={"version": 9}, headers=auth, timeout=60).status_code == 404
    assert httpx.post(url + "/admin/load", json=[1], headers=auth, timeout=60).status_code == 400
    r = httpx.post(url + "/admin/load", json={"version": 1}, headers=auth, timeout=60)
    assert r.status_code == 200 and r.json()["version"] == 1
    assert httpx.get(url + "/v1/models").json()["data"][0]["horizon_weight_version"] == 1
    prompt = TOK.encode("hello")
    ch = httpx.post(url + "/v1/completions", json=dict(prompt=prompt, max_tokens=12, seed=4, logprobs=1),
                    timeout=120).json()["choices"][0]
    ref = _reference(server["params"][1], prompt, 4, 12)
    np.testing.assert_array_equal(ch["horizon_token_ids"], ref.tokens)
    assert set(ch["horizon_weight_versions"]) == {1}
    server["svc"].load(server["params"][0], 0)           # back to the module's weights


def test_concurrent_clients_share_the_engine(server):
    """16 clients at once: all answered, each as it would be alone (the same seed's tokens)."""
    prompt = TOK.encode("x = 1")
    alone = httpx.post(server["url"] + "/v1/completions", json=dict(prompt=prompt, max_tokens=8, seed=42),
                       timeout=120).json()["choices"][0]["horizon_token_ids"]

    def one(i):
        seed = 42 if i % 2 == 0 else 1000 + i
        r = httpx.post(server["url"] + "/v1/completions", json=dict(prompt=prompt, max_tokens=8, seed=seed),
                       timeout=120)
        return seed, r.status_code, r.json()["choices"][0]["horizon_token_ids"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        res = list(pool.map(one, range(32)))
    assert all(code == 200 for _, code, _ in res)
    assert all(toks == alone for seed, _, toks in res if seed == 42)


def test_serve_config_validation():
    validate_serve_config(CFG)
    bad = ml_collections.ConfigDict(CFG.to_dict())
    bad.serve.port = 70000
    with pytest.raises(ConfigError, match="serve.port"):
        validate_serve_config(bad)


def test_seed_key_round_trip():
    for s in (0, 1, 2**32 - 1, 2**32, 2**64 - 1):
        assert api.key_seed(api.seed_key(s)) == s
    np.testing.assert_array_equal(api.seed_key(7), jax.random.key_data(jax.random.PRNGKey(7)))


@pytest.mark.slow
def test_eval_remote_equals_in_process(server, tmp_path, load_script):
    """experiments/eval.py on 8 tasks x 1 pass: the same per-episode results in-process and through the
    server (`rl.sampler.backend="remote"`) serving the same weights. Slow (two eval runs, ~1 min);
    the default suite's `test_remote_policy_equals_engine_policy` checks the same policy path."""
    from horizon.eval import load_params
    from horizon.utils.seeds import run_keys

    drv = load_script("experiments/eval.py")
    base = ["--config=configs/eval_tiny.py", "--config.eval.num_tasks=8", "--config.eval.num_passes=1",
            "--config.eval.backend=local", "--config.eval.checkpoints=('untrained=',)", "--config.eval.warmup=False"]
    c = drv.load_config(base)
    params, _ = load_params("", c, run_keys(c.seed)["init"])
    server["svc"].load(params, 7)                      # a new version: the engine swaps at its next round-trip
    try:
        drv.main(base + [f"--config.eval.output_dir={tmp_path / 'local'}"])
        drv.main(base + [f"--config.eval.output_dir={tmp_path / 'remote'}", "--config.rl.sampler.backend=remote",
                         f"--config.rl.sampler.base_url={server['url']}/v1"])
    finally:
        server["svc"].load(server["params"][0], 0)
    keys = ("task_id", "pass_index", "end_reason", "completion_tokens", "processed_tokens", "reward", "turns",
            "tool_calls", "malformed_calls")
    rows = {}
    for name in ("local", "remote"):
        recs = [json.loads(line) for line in (tmp_path / name / "records.jsonl").read_text().splitlines()]
        rows[name] = sorted(tuple(r.get(k) for k in keys) for r in recs)
    assert len(rows["local"]) == 8 and rows["local"] == rows["remote"]
    assert len({r[3] for r in rows["local"]}) > 1       # the episodes differ from each other: a real comparison
