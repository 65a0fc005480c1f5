"""An OpenAI-compatible HTTP server over horizon's engine (docs/SERVING.md): `/v1/models`,
`/v1/completions`, `/v1/chat/completions` (streamed as server-sent events on request) and a
token-guarded `/admin/load` that swaps in a published weight version.

FastAPI + uvicorn (the field's standard; the OpenAI and vLLM servers are built the same way):
request bodies are parsed by `openai_api` rather than by pydantic models so that every refusal is
one OpenAI-style 4xx JSON error naming its field. Every request goes through one `EngineService`,
so concurrent requests share the engine's continuous batching; a failing request never takes the
server down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from horizon.inference import openai_api as api
from horizon.inference.config import validate_engine
from horizon.inference.engine import Request as EngineRequest
from horizon.inference.service import EngineService
from horizon.utils.config import ConfigError, need, need_int
from horizon.utils.files import url_dir


def _error(e: api.ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class _Seeds:
    """Seeds for requests without one: a stream of 64-bit draws from the server's own seed."""

    def __init__(self, seed: int):
        self._rng, self._lock = np.random.default_rng(seed), threading.Lock()

    def draw(self) -> int:
        with self._lock:
            return int(self._rng.integers(0, api.SEED_LIMIT, dtype=np.uint64))


def _admit(request: Request, admin_token: str) -> None:
    """An admin route's guard: 401 unless the server has a token and the request bears it."""
    auth = request.headers.get("authorization", "")
    if not admin_token or not hmac.compare_digest(auth.encode(), f"Bearer {admin_token}".encode()):
        raise api.ApiError(401, "the admin route needs 'Authorization: Bearer <serve.admin_token>'",
                           kind="authentication_error")


def make_app(service: EngineService, tok, *, model_id: str, max_len: int, vocab: int, admin_token: str = "",
             load_version: Callable[[int], dict] | None = None, weights_dir: str = "", seed: int = 0) -> FastAPI:
    """The app; `load_version(v) -> params` reads a published version of the store `weights_dir`
    (`/admin/load`; ``GET /admin/weights`` names the store and the version served; both refused
    when `admin_token` is empty or the request's bearer token differs)."""
    app = FastAPI(title="horizon", docs_url=None, redoc_url=None)
    seeds = _Seeds(seed)

    @app.exception_handler(api.ApiError)
    async def _api_error(_: Request, e: api.ApiError):
        return _error(e)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception):
        return _error(api.ApiError.server(e))

    async def body_of(request: Request) -> dict:
        return await _body(request, model_id)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "horizon",
                                            "max_model_len": max_len, "horizon_weight_version": service.version}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "weight_version": service.version, **{k: int(v) for k, v in service.stats.items()}}

    @app.get("/admin/weights")
    async def weights(request: Request):
        _admit(request, admin_token)
        store = url_dir(weights_dir).canonical if weights_dir and load_version is not None else ""
        return {"object": "weights", "weights_dir": store, "version": service.version}

    @app.post("/admin/load")
    async def load(request: Request):
        _admit(request, admin_token)
        body = await body_of(request)
        v = body.get("version") if isinstance(body, dict) else None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise api.ApiError(400, f"'version' must be a non-negative integer, got {v!r}", "version")
        if load_version is None:
            raise api.ApiError(400, "this server has no weight store (async_.storage_url / serve.weights_dir)")
        try:
            params = await run_in_threadpool(load_version, v)
        except (FileNotFoundError, KeyError, ValueError) as e:
            raise api.ApiError(404, f"weight version {v} could not be loaded: {e}", "version", "not_found_error") from e
        service.load(params, v)
        return {"version": v, "object": "weights"}

    async def complete(request: Request, chat: bool):
        s = api.parse_request(await body_of(request), tok, vocab=vocab, max_len=max_len, chat=chat)
        keys = [api.seed_key(x) for x in api.choice_seeds(s, seeds.draw)]
        reqs = [EngineRequest(np.asarray(p, np.int32), keys[i * s.n + j], s.max_tokens, None, s.temperature, s.top_p)
                for i, p in enumerate(s.prompts) for j in range(s.n)]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        prompt_tokens = sum(len(p) for p in s.prompts) * s.n
        if s.stream:
            return StreamingResponse(_stream(service, tok, s, reqs, rid, model_id), media_type="text/event-stream")
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in reqs]
        service.submit_many([(r, lambda res, f=f: loop.call_soon_threadsafe(_settle, f, res), None)
                             for r, f in zip(reqs, futs)])
        done = []
        for f in futs:
            done.append(await f)
        choices = [api.choice_body(tok, s, i, c) for i, c in enumerate(done)]
        return api.response_body("chat" if chat else "text", rid, model_id, choices, prompt_tokens)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    return app


async def _body(request: Request, model_id: str) -> dict:
    """The request's JSON body; a body that is not JSON, or names another model, is refused."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise api.ApiError(400, "the request body is not valid JSON") from None
    if isinstance(body, dict) and body.get("model") not in (None, model_id):
        raise api.ApiError(404, f"model {body.get('model')!r} is not served here; /v1/models lists {model_id!r}",
                           "model", "not_found_error")
    return body


def _settle(fut: asyncio.Future, res) -> None:
    if fut.done():
        return
    if isinstance(res, ValueError):          # the engine refused the request: the client's error
        fut.set_exception(api.ApiError(400, str(res)))
    elif isinstance(res, BaseException):
        fut.set_exception(api.ApiError.server(res))
    else:
        fut.set_result(res)


def _event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


async def _stream(service: EngineService, tok, s: api.Sampling, reqs: list, rid: str, model_id: str):
    """Server-sent events: per choice, the tokens drawn since its last event after every engine
    round-trip, then its finish reason; ``data: [DONE]`` at the end (an error ends the stream with
    an error event)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    service.submit_many([(r, lambda res, i=i: loop.call_soon_threadsafe(q.put_nowait, (i, "done", res)),
                          lambda toks, lps, i=i: loop.call_soon_threadsafe(q.put_nowait, (i, "progress", (toks, lps))))
                         for i, r in enumerate(reqs)])
    sent = [0] * len(reqs)
    said = [""] * len(reqs)
    open_ = len(reqs)
    if s.chat:
        for i in range(len(reqs)):
            first = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model_id,
                     "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            yield _event(first)
    while open_:
        i, what, res = await q.get()
        if what == "progress":
            toks, lps = res
            if len(toks) > sent[i]:
                text = api.stream_text(tok, toks, said[i], None)
                yield _event(api.chunk_body(s, tok, rid, model_id, i, toks[sent[i]:], lps[sent[i]:], None, text))
                sent[i], said[i] = len(toks), said[i] + text
            continue
        open_ -= 1
        if isinstance(res, BaseException):
            yield _event(api.ApiError.server(res).body())
            continue
        toks, lps = [int(t) for t in res.tokens], [float(x) for x in res.logprobs]
        finish = "stop" if res.stopped else "length"
        text = api.stream_text(tok, toks, said[i], finish)
        yield _event(api.chunk_body(s, tok, rid, model_id, i, toks[sent[i]:], lps[sent[i]:], finish, text))
        sent[i] = len(toks)
    yield "data: [DONE]\n\n"


@contextlib.contextmanager
def serving(app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
    """`app` served by uvicorn on a thread (port 0: a free one) for the `with` block; yields the
    server's root URL (tests, notebooks; experiments/serve.py runs uvicorn in the foreground)."""
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
    th = threading.Thread(target=srv.run, name="uvicorn", daemon=True)
    th.start()
    t0 = time.time()
    while not srv.started:
        if not th.is_alive() or time.time() - t0 > 60:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        srv.should_exit = True
        th.join(timeout=30)


def validate_serve_config(c) -> None:
    """The `serve` section (configs/serve_tiny.py) and the engine it runs; one-line `ConfigError`s."""
    if "serve" not in c:
        raise ConfigError("the config has no 'serve' section (configs/serve_tiny.py)")
    s = c.serve
    need(isinstance(s.get("host"), str) and bool(s.host), "serve.host", s.get("host"), "must be a host name or address")
    need_int(s, "port", "serve", lo=0, hi=65535)
    need_int(s, "seed", "serve", lo=0)
    need(isinstance(s.get("warmup"), bool), "serve.warmup", s.get("warmup"), "must be True or False")
    for k in ("checkpoint", "model_id", "admin_token", "weights_dir", "log_level"):
        need(isinstance(s.get(k), str), f"serve.{k}", s.get(k), "must be a string")
    need(bool(s.model_id), "serve.model_id", s.model_id, "must not be empty")
    need(s.log_level in ("critical", "error", "warning", "info", "debug"), "serve.log_level", s.log_level,
         "must be one of critical, error, warning, info, debug")
    validate_engine(c)
