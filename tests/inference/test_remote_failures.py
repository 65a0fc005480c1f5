"""The remote policy's failure handling against stand-in endpoints (docs/SERVING.md): a 5xx or a lost
connection is retried then `RemoteBackendError`, a 4xx is raised at once, a response without token
ids or log-probs is refused; the RL probe refuses such endpoints in one line before any work; the
streamed text of a multi-byte character split between events. No model: each stand-in is a few lines."""

import jax
import ml_collections
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from horizon.data.tokenizer import ByteTokenizer
from horizon.inference import openai_api as api
from horizon.inference.remote import RemoteBackendError, RemotePolicy
from horizon.inference.server import serving
from horizon.rl.runtime import remote as rl_remote
from horizon.utils.config import ConfigError

TOK = ByteTokenizer()


def _app(status: int = 200, fail_first: int = 0, token_ids: bool = True, admin: bool = True,
         store: str = "/runs/x/weights") -> FastAPI:
    app, calls = FastAPI(), {"n": 0}

    @app.post("/v1/completions")
    async def completions():
        calls["n"] += 1
        if calls["n"] <= fail_first or status != 200:
            return JSONResponse({"error": {"message": "boom"}}, status_code=status if status != 200 else 503)
        ch = {"index": 0, "text": "a", "finish_reason": "length",
              "logprobs": {"tokens": ["token_id:97" if token_ids else "a"], "token_logprobs": [-0.5]}}
        return {"choices": [ch]}

    if admin:
        @app.get("/admin/weights")
        async def weights():
            return {"object": "weights", "weights_dir": store, "version": 0}

    app.state.calls = calls
    return app


def _policy(url: str, retries: int = 2) -> RemotePolicy:
    p = RemotePolicy(url + "/v1", jax.random.PRNGKey(0), retries=retries)
    return p


def _cfg(url: str, weights: str = "/runs/x/weights") -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(rl=dict(sampler=dict(backend="remote", base_url=url + "/v1",
                                                               remote_weights_dir=weights))))


def test_transient_5xx_is_retried(monkeypatch):
    monkeypatch.setattr("horizon.inference.remote.time.sleep", lambda s: None)
    app = _app(fail_first=2)
    with serving(app) as url:
        g = _policy(url, retries=2)([[1, 2, 3]], 4)[0]
    assert g.tokens.tolist() == [97] and app.state.calls["n"] == 3


def test_persistent_5xx_and_lost_server_raise_backend_error(monkeypatch):
    monkeypatch.setattr("horizon.inference.remote.time.sleep", lambda s: None)
    with serving(_app(status=500)) as url:
        with pytest.raises(RemoteBackendError, match="failed 3 times"):
            _policy(url)([[1]], 4)
    with pytest.raises(RemoteBackendError, match="ConnectError"):
        _policy(url)([[1]], 4)                                   # the server is gone now


def test_4xx_is_raised_at_once():
    app = _app(status=400)
    with serving(app) as url:
        with pytest.raises(ValueError, match="refused the request"):
            _policy(url)([[1]], 4)
    assert app.state.calls["n"] == 1


def test_no_token_ids_is_refused():
    with serving(_app(token_ids=False)) as url:
        with pytest.raises(RemoteBackendError, match="no token ids"):
            _policy(url)([[1]], 4)


def test_probe_refuses_before_work():
    with serving(_app(token_ids=False)) as url:
        with pytest.raises(ConfigError, match="no token ids"):
            rl_remote.probe(_cfg(url), TOK)
    with serving(_app(admin=False)) as url:
        with pytest.raises(ConfigError, match="no horizon admin routes"):
            rl_remote.probe(_cfg(url), TOK)
    with pytest.raises(ConfigError, match="no OpenAI-compatible server answers"):
        rl_remote.probe(_cfg(url), TOK)
    with serving(_app()) as url:
        with pytest.raises(ConfigError, match="loads weights from '/runs/x/weights' but this run publishes them "
                                              "to '/runs/y/weights'"):
            rl_remote.probe(_cfg(url, "/runs/y/weights"), TOK)
        rl_remote.probe(_cfg(url, "/runs/y/weights"), TOK, weights="/runs/x/../x/weights")   # the run's store named
        rl_remote.probe(_cfg(url), TOK)                          # token ids, log-probs, the admin routes, one store


def test_stream_text_holds_back_a_split_character():
    toks = list("é!".encode())                                   # é is two bytes
    first = api.stream_text(TOK, toks[:1], "", None)
    assert first == ""                                           # half a character waits
    rest = api.stream_text(TOK, toks, first, "length")
    assert first + rest == TOK.decode(toks) == "é!"


def test_backend_fields_validated():
    from horizon.inference.config import validate_backend

    ok = dict(backend="remote", base_url="http://127.0.0.1:8000/v1", remote_concurrency=4, remote_retries=0,
              remote_timeout_s=5.0)
    validate_backend(ml_collections.ConfigDict(ok))
    for bad, field in ((dict(ok, backend="vllm"), "backend"), (dict(ok, base_url="127.0.0.1:8000"), "base_url"),
                       (dict(ok, remote_concurrency=0), "remote_concurrency")):
        with pytest.raises(ConfigError, match=f"rl.sampler.{field}"):
            validate_backend(ml_collections.ConfigDict(bad))
