"""The RL side of ``rl.sampler.backend = "remote"`` (docs/SERVING.md): every weight version that a
rollout or an eval samples with is published to the run's weight store (`weight_sync`) and loaded
by the server (`inference.remote.RemotePolicy.sync_weights` calls ``/admin/load``); and the endpoint
is probed before any work, so a server that cannot drive RL is refused in one line.
"""

from __future__ import annotations

import os
import pathlib

import httpx

from horizon.inference.remote import ADMIN_TOKEN_ENV, RemoteBackendError, generation_of
from horizon.rl.runtime.weight_sync import WeightPublisher
from horizon.utils.config import ConfigError
from horizon.utils.files import url_dir


def is_remote(c) -> bool:
    return "rl" in c and "sampler" in c.rl and str(c.rl.sampler.get("backend", "engine")) == "remote"


def weights_dir(c) -> str:
    """Where a run publishes the versions a server loads: `rl.sampler.remote_weights_dir`, else
    ``<async_.storage_url>/<run name>/weights`` where a storage URL is set, else ``<exp.out_dir>/weights``
    (the async runtime's layout, `async_setup.data_root`)."""
    own = str(c.rl.sampler.get("remote_weights_dir", "") or "")
    if own:
        return own
    url = str(c.async_.get("storage_url", "") or "").rstrip("/") if "async_" in c else ""
    name = pathlib.Path(str(c.exp.out_dir)).name
    return f"{url}/{name}/weights" if url else str(pathlib.Path(str(c.exp.out_dir)) / "weights")


class VersionPush:
    """``push(params, version)`` for `RemotePolicy`: each version published once (deltas against the
    last, `rl.sampler.remote_publish_dtype`: float32 samples exactly what the trainer holds)."""

    def __init__(self, c):
        self.directory = weights_dir(c)
        dtype = str(c.rl.sampler.get("remote_publish_dtype", "float32"))
        self.publisher = WeightPublisher(self.directory, dtype=dtype)
        self.publisher.resume()
        self.done: set[int] = set()

    def __call__(self, params, version: int) -> None:
        if int(version) not in self.done:
            self.publisher.publish(params, int(version))
            self.done.add(int(version))

    def close(self) -> None:
        self.publisher.close()


def already_published(params, version: int) -> None:
    """The push of an async rollout worker: the trainer published every version already
    (`processes.trainer_main`), so the server only loads it (`RemotePolicy.sync_weights`)."""


def push_for(c) -> VersionPush | None:
    """The run's weight push, or None for the in-process engine."""
    return VersionPush(c) if is_remote(c) else None


def probe(c, tok, weights: str | None = None) -> None:
    """Refuse (`ConfigError`, one line) an endpoint that does not answer, returns no token ids or
    log-probs, would refuse the run's weight updates (no horizon admin routes, or a wrong token), or
    loads them from another store than `weights` (the directory the run publishes to, default
    `weights_dir`)."""
    s = c.rl.sampler
    url = str(s.base_url).rstrip("/")
    body = {"prompt": list(tok.context_start()) or [0], "max_tokens": 1, "logprobs": 1, "seed": 0,
            "return_tokens_as_token_ids": True}
    if str(s.get("remote_model", "")):
        body["model"] = str(s.remote_model)
    try:
        r = httpx.post(f"{url}/completions", json=body, timeout=float(s.get("remote_timeout_s", 600.0)))
        if r.status_code >= 400:
            raise ConfigError(f"rl.sampler.base_url={url!r}: a 1-token completion was refused ({r.status_code}): "
                              f"{r.text[:200]}")
        generation_of(r.json()["choices"][0], 0)
        token = os.environ.get(ADMIN_TOKEN_ENV, "")
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        a = httpx.get(f"{url.removesuffix('/v1')}/admin/weights", headers=auth, timeout=60)
    except httpx.HTTPError as e:
        raise ConfigError(f"rl.sampler.base_url={url!r}: no OpenAI-compatible server answers ({type(e).__name__}); "
                          "start one with experiments/serve.py (docs/SERVING.md)") from None
    except (RemoteBackendError, KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"rl.sampler.base_url={url!r}: {e}") from None
    if a.status_code in (401, 403):
        raise ConfigError(f"rl.sampler.base_url={url!r}: the admin routes refuse this run's token; set "
                          f"${ADMIN_TOKEN_ENV} to the server's serve.admin_token")
    if a.status_code == 404 or "weights_dir" not in a.json():
        raise ConfigError(f"rl.sampler.base_url={url!r}: no horizon admin routes ({a.status_code}): RL pushes "
                          "its weights through /admin/load (docs/SERVING.md, 'Use with vLLM / SGLang')")
    mine, theirs = url_dir(weights or weights_dir(c)).canonical, str(a.json()["weights_dir"])
    if mine != theirs:
        raise ConfigError(f"rl.sampler.base_url={url!r}: the server loads weights from {theirs or 'no store'!r} but "
                          f"this run publishes them to {mine!r}; start it with --config.serve.weights_dir={mine}")
