"""The rollout engine's compile plan and its warm-up (docs/INFERENCE.md, "Compile once").

Every jitted call of an `Engine` takes its sizes from a finite set fixed by its `EngineConfig`:
attention windows (`window_for`: `min_window` up to `max_len`, `window_per_octave` per doubling),
prefill chunks (`chunk_bucket`), prefill rows (`rows_bucket`), the decode chunk
(`sync_tokens`); a prefix copy always moves `slots` rows. `plan(ec)` lists that set;
`warm_up(engine)` compiles all of it before the first request, on the engine's own weights and
cache, without changing what any later request samples (every call writes nothing a request reads:
padding rows, inactive slots, a row copied onto itself).
A run warms its engine shapes once (`horizon.rl.runtime.warmup`); with the persistent compilation
cache a later process reads them from disk.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from horizon.inference.config import EngineConfig
from horizon.inference.device import (
    chunk_bucket,
    copy_rows,
    decode_loop,
    extract_row,
    insert_row,
    prefill_rows,
    rows_bucket,
    sample_rows,
    window_for,
)
from horizon.parallel import sharded


@dataclasses.dataclass(frozen=True)
class Plan:
    """The engine's compile shapes: windows, prefill chunks, row buckets, decode chunk lengths."""

    windows: tuple[int, ...]
    chunks: tuple[int, ...]
    rows: tuple[int, ...]
    decode_steps: tuple[int, ...]

    def calls(self) -> list[tuple]:
        """Every (function, sizes) the engine can call: prefill (rows, chunk, window), first-token
        draws (rows), decode (steps, window), prefix copies (window), park-store swaps (window)."""
        out = [("prefill", b, c, w) for b in self.rows for c in self.chunks for w in self.windows]
        out += [("sample", b) for b in self.rows]
        out += [("decode", k, w) for k in self.decode_steps for w in self.windows]
        out += [("copy", w) for w in self.windows]
        out += [(k, w) for k in ("extract", "insert") for w in self.windows]
        return out


def plan(ec: EngineConfig, decode_steps: tuple[int, ...] = ()) -> Plan:
    """`ec`'s compile shapes (module docstring); decode chunks of `ec.sync_tokens` steps and of each
    of `decode_steps` (the RL rollouts' in-flight polling interval, `rl.sampler.chunk_tokens`, beside
    the eval's `sync_tokens`)."""
    return Plan(windows=tuple(sorted({window_for(n, ec) for n in range(1, ec.max_len + 1)})),
                chunks=tuple(sorted({chunk_bucket(n, ec) for n in range(1, ec.prefill_chunk + 1)})),
                rows=tuple(sorted({rows_bucket(n, ec) for n in range(1, ec.slots + 1)})),
                decode_steps=tuple(sorted({int(ec.sync_tokens), *(int(k) for k in decode_steps if k > 0)})))


def warm_up(engine, *, decode_steps: tuple[int, ...] = (), on_call=None) -> int:
    """Compile every call of `plan(engine.ec, decode_steps)` on `engine` (an idle `Engine`;
    replicas: each of `engine.engines`). `on_call()` runs after each call (a progress bar's
    update). Returns the number of calls made."""
    engines = getattr(engine, "engines", [engine])
    n = 0
    for e in engines:
        if e.busy or e.table.active:
            raise RuntimeError("warm_up needs an idle engine (no request submitted yet)")
        for call in plan(e.ec, decode_steps).calls():
            _call(e, call)
            n += 1
            if on_call is not None:
                on_call()
    return n


def _call(e, call: tuple) -> None:
    """One compile-plan call on engine `e`, writing nothing a request reads."""
    S, kind = e.ec.slots, call[0]
    if kind == "prefill":
        _, b, c, w = call
        e.cache, logits, _ = prefill_rows(e.params, e.cache, jnp.full((b,), S, jnp.int32), jnp.zeros((b, c), jnp.int32),
                                          jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.int32), cfg=e.mcfg,
                                          window=w, mesh=e.mesh)
        jax.block_until_ready(logits)
    elif kind == "sample":
        b = call[1]                                               # logits as a prefill returns them
        home = jax.tree.leaves(e.cache)[0].sharding
        logits = jax.device_put(jnp.zeros((b, int(e.mcfg.vocab_size)), jnp.float32), home)
        kd = np.asarray(e.st["key_data"])
        out = sample_rows(logits, jnp.zeros(S, jnp.int32), jnp.asarray(kd), jnp.zeros(S, jnp.int32),
                          jnp.ones(S, jnp.float32), jnp.ones(S, jnp.float32))
        jax.block_until_ready(out)
    elif kind == "decode":
        st = dict(e.st, active=np.zeros(S, bool))                # nothing active: the loop exits at once
        dev = jax.device_put(st, e.device) if e.mesh is None else sharded.place_sampling_rows(st, e.mesh)
        e.cache, _, outs = decode_loop(e.params, e.cache, dev, jnp.int32(0), cfg=e.mcfg, steps=call[1],
                                       window=call[2], mesh=e.mesh)
        jax.block_until_ready(outs)
    elif kind == "copy":
        e.cache = copy_rows(e.cache, jnp.zeros(S, jnp.int32), jnp.full(S, S, jnp.int32), window=call[1], mesh=e.mesh)
    elif kind == "extract":
        jax.block_until_ready(extract_row(e.cache, jnp.int32(0), length=call[1]))
    elif kind == "insert":                                        # row 0's own positions written back
        saved = extract_row(e.cache, jnp.int32(0), length=call[1])
        e.cache = insert_row(e.cache, jnp.int32(0), saved, mesh=e.mesh)
    else:
        raise ValueError(f"unknown engine call {kind!r}")
