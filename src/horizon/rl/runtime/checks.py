"""`validate(config)` for the RL drivers (experiments/rl.py, selfsum.py, rl_async.py): every value
they read is checked right after the command line is parsed, before any run directory, sandbox or
compile exists (docs/SPEC.md §7). Each failure is one `ConfigError` line naming the field, its
value and what is allowed; `horizon.utils.cli.load` prints it and exits 2.

The checks follow the config's sections: `model` (`transformer.validate_config`), `mesh`, `agent`
(`validate_agent_config` + the budget against `model.max_seq_len`), `rl` (loss, KL, sampler,
batch, optimizer, prompt sampler, length penalty) and `exp` (task family, sandboxes, SFT, eval).
"""

from __future__ import annotations

import pathlib

from horizon.agent import validate_agent_config
from horizon.agent.rollout import STRATEGIES
from horizon.data.tokenizer import tokenizer_from_config, validate_tokenizer
from horizon.env import rewards
from horizon.env.families import FAMILIES, family_from_config
from horizon.inference.config import validate_engine
from horizon.model import transformer
from horizon.parallel import mesh as pmesh
from horizon.parallel.packing import ROW_ORDER_METHODS
from horizon.rl.algo import losses
from horizon.rl.runtime import remote
from horizon.rl.runtime.async_setup import data_root, mesh_devices
from horizon.rl.runtime.core import batch_slots
from horizon.rl.runtime.pools import POOLS, docker_host_for, parse_resources
from horizon.rl.runtime.weight_sync import CODECS, DTYPES
from horizon.rl.runtime.workers import KV_MODES
from horizon.sandbox import docker_available
from horizon.sandbox.docker import EXECUTORS
from horizon.train.checkpoint import saved_steps
from horizon.train.optim import validate_optim_config
from horizon.utils.config import ConfigError, need, need_choice, need_float, need_int
from horizon.utils.files import storage_protocols

BACKENDS = ("docker", "local")
CORRUPT_KINDS = ("next", "random")
ASYNC_LOOPS = ("sync", "async", "sync_mp")


def validate_model(c) -> None:
    transformer.validate_config(c.model)
    need_int(c.model, "max_seq_len", "model", lo=8)
    validate_tokenizer(c.model)
    validate_init_checkpoint(c.model)


def validate_init_checkpoint(m) -> None:
    """`model.init_checkpoint` / `model.init_step`: a checkpoint directory that holds the step, and not
    together with `model.init_from` (one starting point)."""
    src = str(m.get("init_checkpoint", "") or "")
    if not src:
        return
    need(not str(m.get("init_from", "") or ""), "model.init_checkpoint", src, "and model.init_from are both set")
    steps = saved_steps(src)
    need(bool(steps), "model.init_checkpoint", src, "holds no checkpoint steps (a run's checkpoints/ directory)")
    step = int(m.get("init_step", -1))
    need(step == -1 or step in steps, "model.init_step", step, f"is not among {src}'s steps {steps}")


def validate_agent_budget(c) -> None:
    """The agent section and its context budget: trigger < max_context_tokens <= model.max_seq_len,
    for the agent's strategy and each of `exp.strategies` (selfsum runs them all)."""
    strategies = tuple(c.exp.get("strategies", ())) if "exp" in c else ()
    validate_agent_config(c.agent, strategies=strategies, strategies_field="exp.strategies",
                          max_seq_len=int(c.model.max_seq_len))


def validate_rl(c, steps: int) -> None:
    """The `rl` section for a run of `steps` trainer steps."""
    r = c.rl
    need_int(r, "group_size", "rl", lo=1)
    need_int(r, "prompts_per_step", "rl", lo=1)
    losses.validate_loss_config(r)    # loss aggregation, clip, KL, stale-token caps
    need_float(r, "adv_std_eps", "rl", 0.0, lo_open=True)
    lp = r.length_penalty
    try:
        rewards.validate_curve_params(lp.k, lp.q)
    except ValueError as e:
        raise ConfigError(f"rl.length_penalty: {e}") from None
    need_float(lp, "scale", "rl.length_penalty", 0.0)
    for k in r.behaviour:
        need_float(r.behaviour, k, "rl.behaviour")
    s = r.sampler
    need_float(s, "temperature", "rl.sampler", 0.0)
    need_float(s, "top_p", "rl.sampler", 0.0, 1.0, lo_open=True)
    for k in ("min_batch_bucket", "min_prompt_bucket", "min_new_bucket", "chunk_tokens", "sync_tokens"):
        need_int(s, k, "rl.sampler", lo=1)
    need_choice(s, "kv_mode", "rl.sampler", KV_MODES)
    validate_engine(c)
    n = need_int(r, "slots_per_batch", "rl", lo=0)
    need(n == 0 or int(r.prompts_per_step) % n == 0, "rl.slots_per_batch", n,
         f"must divide rl.prompts_per_step={r.prompts_per_step} (0 = all of them)")
    b = r.batch
    for k in ("min_rows", "min_seq", "min_groups"):
        need_int(b, k, "rl.batch", lo=1)
    need_int(b, "micro_rows", "rl.batch", lo=0)
    if "memory_check" in r:           # horizon.rl.runtime.memory
        need_float(r.memory_check, "fraction", "rl.memory_check", 0.0, 1.0, lo_open=True)
        need_float(r.memory_check, "budget_gib", "rl.memory_check", 0.0)
        if "mappings_fraction" in r.memory_check:
            need_float(r.memory_check, "mappings_fraction", "rl.memory_check", 0.0, 1.0)
    need(int(r.optim.steps) == steps, "rl.optim.steps", r.optim.steps, f"must equal the run's steps ({steps})")
    validate_optim_config(r.optim, "rl.optim", steps, "exp.steps")
    need_int(r, "checkpoint_every", "rl", lo=1)
    need_int(r, "max_checkpoints", "rl", lo=1)
    need_int(r, "hard_prompt_start_step", "rl", lo=-1)
    need_int(r.infra, "group_retries", "rl.infra", lo=0)
    need_int(r.infra, "replacements", "rl.infra", lo=0)


def validate_rl_mesh(c) -> None:
    """`mesh` for an RL driver (docs/SPEC.md §2): a mesh this process can build (`mesh.validate_mesh`), a
    power-of-two data-parallel rank count that divides every bucketed batch (RL rows and
    micro-batches, SFT rows; sampler batches are bucketed to at least it), sequences that split
    for CP, and the packing method / cost model."""
    pmesh.validate_mesh(c, power_of_two_ranks=True)
    nb, cp = pmesh.data_ranks(c), pmesh.mesh_sizes(c.mesh)[pmesh.SEQ_AXIS]
    b = c.rl.batch
    need(int(b.min_rows) >= nb, "rl.batch.min_rows", b.min_rows, f"must be >= the mesh's {nb} data-parallel ranks")
    micro = int(b.get("micro_rows", 0) or 0)
    need(micro % nb == 0, "rl.batch.micro_rows", micro, f"must be a multiple of the mesh's {nb} data-parallel ranks")
    need(int(b.min_seq) % (2 * cp) == 0, "rl.batch.min_seq", b.min_seq, f"must be divisible by 2*mesh.context={2 * cp}")
    if "exp" in c and "sft" in c.exp:
        s = c.exp.sft
        for k in ("batch_size", "clean_batch_size"):
            if s.get(k) is not None:
                need(int(s[k]) % nb == 0, f"exp.sft.{k}", s[k],
                     f"must be divisible by the mesh's {nb} data-parallel ranks")
        for k in ("seq_len", "clean_seq_len"):
            if s.get(k) is not None:
                need(int(s[k]) % (2 * cp) == 0, f"exp.sft.{k}", s[k], f"must be divisible by 2*mesh.context={2 * cp}")
        need(cp == 1 or int(c.model.mtp_depth) == 0, "model.mtp_depth", c.model.mtp_depth,
             "must be 0 with mesh.context > 1 (the SFT step's zigzag layout; MTP needs natural order)")
    m = c.mesh
    need_choice(m, "packing", "mesh", ROW_ORDER_METHODS)
    need_float(m, "packing_cost_a", "mesh", 0.0)
    need_float(m, "packing_cost_b", "mesh", 0.0)


def validate_sft(c) -> None:
    """`exp.sft`: both warm-start stages (`warmstart.two_stage_sft`)."""
    s = c.exp.sft
    fmt = str(c.agent.get("tool_format", "horizon")) if "agent" in c else "horizon"
    need(fmt == "horizon", "agent.tool_format", fmt, "the SFT demonstrators write the 'horizon' tool-call format; "
         "start from a checkpoint (model.init_from) without the SFT stage to train another format")
    steps = need_int(s, "steps", "exp.sft", lo=1)
    clean = need_int(s, "clean_steps", "exp.sft", lo=0) if "clean_steps" in s else 0
    for k in ("batch_size", "seq_len", "log_every"):
        need_int(s, k, "exp.sft", lo=1)
    need(int(s.seq_len) <= int(c.model.max_seq_len), "exp.sft.seq_len", s.seq_len,
         f"must be <= model.max_seq_len={c.model.max_seq_len}")
    need_float(s, "corrupt_prob", "exp.sft", 0.0, 1.0)
    if "corrupt" in s:
        need_choice(s, "corrupt", "exp.sft", CORRUPT_KINDS)
    validate_optim_config(s.optim, "exp.sft.optim", steps, "exp.sft.steps")
    if clean > 0:
        need(int(s.optim.warmup_steps) < clean, "exp.sft.optim.warmup_steps", s.optim.warmup_steps,
             f"must be < exp.sft.clean_steps={clean}")
        for k in ("clean_seq_len", "clean_batch_size"):
            if s.get(k) is not None:
                need_int(s, k, "exp.sft", lo=1)
        if s.get("clean_lr") is not None:
            need_float(s, "clean_lr", "exp.sft", 0.0, lo_open=True)
        if s.get("clean_seq_len") is not None:
            need(int(s.clean_seq_len) <= int(c.model.max_seq_len), "exp.sft.clean_seq_len", s.clean_seq_len,
                 f"must be <= model.max_seq_len={c.model.max_seq_len}")
    if "probe_every" in s:
        need_int(s, "probe_every", "exp.sft", lo=0)
    if int(s.get("probe_every", 0) or 0) > 0 and str(s.get("probe_path", "") or ""):
        need(pathlib.Path(str(s.probe_path)).is_file(), "exp.sft.probe_path", s.probe_path,
             "no such file: the SFT probe's instances (docs/REAL_REPOS.md builds runs/swe_real/tasks/unseen.jsonl)")
        need_int(s, "probe_turns", "exp.sft", lo=1)


def validate_family(c, env: str | None) -> None:
    """`exp.env` (the driver's family if `env` is given) and `exp.task`: one task is built from
    them, so a bad task option fails here and not in the first rollout."""
    e = c.exp
    need_choice(e, "env", "exp", FAMILIES if env is None else ((env,) if isinstance(env, str) else tuple(env)))
    try:
        family_from_config(e).tasks("train", 1)
    except AttributeError as err:       # a ConfigDict without a field the family reads
        raise ConfigError(f"exp.task: the {e.env} family needs the option {str(err).strip(chr(34))}") from None
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"exp.task: {' '.join(str(err).split())}") from None
    if e.env in ("key_recall", "key_relay"):       # their SFT mixes these strategies' demos (studies.selfsum)
        need("strategies" in e, "exp.strategies", None,
             f"exp.env={e.env!r} needs the strategies of its SFT demos (configs/rl_keyrecall.py)")


def validate_pool_size(c) -> None:
    """`exp.pool_size` holds one generation batch's rollouts (`runtime.batch_slots` * group size)."""
    slots = batch_slots(c) * int(c.rl.group_size)
    need(int(c.exp.pool_size) >= slots, "exp.pool_size", c.exp.pool_size,
         f"must hold one generation's rollouts (rl.slots_per_batch or rl.prompts_per_step, times rl.group_size "
         f"= {slots})")


def validate_sandboxes(c) -> None:
    """`exp.backend` and, for Docker, that the engine answers and has `exp.sandbox_image`."""
    e = c.exp
    need_choice(e, "backend", "exp", BACKENDS)
    need_float(e, "sandbox_cpus", "exp", 0.0, lo_open=True)
    need_int(e, "sandbox_disk_mb", "exp", lo=0)
    need_int(e, "sandbox_replace_attempts", "exp", lo=0)
    if "sandbox_executor" in e:
        need_choice(e, "sandbox_executor", "exp", EXECUTORS)
    need_float(e, "verify_timeout_s", "exp", 0.0, lo_open=True)
    backends = {e.backend} | ({e.demo_backend} if "demo_backend" in e else set())
    if "demo_backend" in e:
        need_choice(e, "demo_backend", "exp", BACKENDS)
    if "docker" in backends:
        if not docker_available():
            raise ConfigError("exp.backend='docker': no Docker engine answers (start it, or "
                              "--config.exp.backend=local for an unisolated run)")
        import docker  # noqa: PLC0415  (optional heavy dependency: only a Docker-backed run needs it)

        try:
            docker.from_env().images.get(str(e.sandbox_image))
        except docker.errors.ImageNotFound:
            raise ConfigError(f"exp.sandbox_image={e.sandbox_image!r}: no such image in the Docker engine "
                              "(build it: make image)") from None


def validate_experiment(c, env) -> None:
    """experiments/rl.py and experiments/selfsum.py: the whole config, for the `env` family (or one of
    a tuple of them)."""
    validate_model(c)
    validate_agent_budget(c)
    e = c.exp
    steps = need_int(e, "steps", "exp", lo=1)
    validate_rl(c, steps)
    validate_rl_mesh(c)
    validate_family(c, env)
    need_int(e, "n_sft_tasks", "exp", lo=0 if e.env == "swebench" else 1)   # a task set has no demonstrations
    validate_pool_size(c)
    validate_sandboxes(c)
    validate_sft(c)
    ev = e.eval
    need_int(ev, "n_tasks", "exp.eval", lo=1)
    need_int(ev, "passes", "exp.eval", lo=1)
    need_int(ev, "every", "exp.eval", lo=0)
    need_float(ev, "temperature", "exp.eval", 0.0)
    need(bool(str(e.out_dir)), "exp.out_dir", e.out_dir, "must name a run directory")
    if "strategies" not in e and str(e.get("ledger", "") or ""):      # an arm of a study (horizon.studies.arms)
        need(str(e.ledger).endswith(".jsonl"), "exp.ledger", e.ledger,
             "must be a .jsonl path (docs/results/<study>.jsonl)")
        need(bool(str(e.get("arm", "") or "")), "exp.arm", e.get("arm"), "must label the run's arm in exp.ledger")
    if "strategies" in e:
        need(len(e.strategies) > 0, "exp.strategies", e.strategies, "must name at least one strategy")
        for s in tuple(e.sft.get("clean_strategies", ())):
            need(s in STRATEGIES, "exp.sft.clean_strategies", s, f"each must be one of {STRATEGIES}")
    for k in ("check_tasks", "demo_sandboxes"):
        if k in e:
            need_int(e, k, "exp", lo=1)
    if remote.is_remote(c):                    # last: the only check that talks to something
        need(c.rl.sampler.get("remote_publish_dtype", "float32") in DTYPES, "rl.sampler.remote_publish_dtype",
             c.rl.sampler.get("remote_publish_dtype"), f"must be one of {DTYPES}")
        remote.probe(c, tokenizer_from_config(c))


def validate_storage_url(url: str) -> None:
    """`async_.storage_url`: "" or a URL of an fsspec protocol whose implementation imports here."""
    if not url:
        return
    from fsspec.core import split_protocol  # noqa: PLC0415
    from fsspec.registry import get_filesystem_class  # noqa: PLC0415

    proto = split_protocol(url)[0] or "file"
    try:
        get_filesystem_class(proto)          # imports just this protocol's implementation
    except (ImportError, ValueError):
        need(False, "async_.storage_url", url,
             f"protocol {proto!r} has no fsspec implementation here (install its package, e.g. s3fs / gcsfs); "
             f"available: {', '.join(storage_protocols())}")


def validate_async(c) -> None:
    """experiments/rl_async.py: model, `rl`, the `async_` section and, for `async_.env="experiment"`,
    the experiment's family, sandboxes and pool (`exp.steps` is every loop's step count)."""
    validate_model(c)
    steps = need_int(c.exp, "steps", "exp", lo=1)
    validate_rl(c, steps)
    validate_rl_mesh(c)
    a = c.async_
    served = remote.is_remote(c)
    need(not served or tuple(a.compare) in (("async",), ("sync_mp",)), "async_.compare", a.compare,
         "with rl.sampler.backend='remote' one orchestrated loop, ('async',) or ('sync_mp',): one server "
         "loads one run's weight store (docs/SERVING.md, 'Async RL')")
    need_int(a, "max_staleness", "async_", lo=0)
    for k in ("num_rollout_workers", "publish_every", "full_every", "keep_fulls", "shard_elems", "publish_threads",
              "threads_per_process", "toy_max_new_tokens", "smooth"):
        need_int(a, k, "async_", lo=1)
    need_int(a, "queue_depth", "async_", lo=0)      # 0 = rl.prompts_per_step (async_setup.worker_queue_depth)
    need_int(a, "prompt_start", "async_", lo=0)
    for k in ("poll_s", "weights_timeout_s", "trainer_start_timeout_s"):
        need_float(a, k, "async_", 0.0, lo_open=True)
    need_float(a, "weight_poll_interval_s", "async_", 0.0)
    need_choice(a, "env", "async_", ("toy", "experiment"))
    need_choice(a, "pool", "async_", POOLS)
    need_int(a, "ray_object_store_mb", "async_", lo=64)
    for k in ("trainer_resources", "rollout_resources"):
        try:
            parse_resources(a.get(k, ""))
        except ValueError as e:
            need(False, f"async_.{k}", a.get(k), str(e))
    validate_storage_url(str(a.get("storage_url", "") or ""))
    try:
        docker_host_for(a.get("docker_hosts", ""), "")
    except ValueError as e:
        need(False, "async_.docker_hosts", a.get("docker_hosts"), str(e))
    n = need_int(a, "trainer_processes", "async_", lo=1)
    devices = mesh_devices(c)
    need(devices % n == 0, "async_.trainer_processes", n, f"must divide the mesh's {devices} devices")
    need_float(a, "ray_memory_threshold", "async_", 0.0, 1.0, lo_open=True)
    need_choice(a, "codec", "async_", CODECS)
    need_choice(a, "publish_dtype", "async_", DTYPES)
    need(len(a.compare) > 0 and all(x in ASYNC_LOOPS for x in a.compare), "async_.compare", a.compare,
         f"must be a non-empty subset of {ASYNC_LOOPS}")
    need(bool(str(a.run_dir)), "async_.run_dir", a.run_dir, "must name a directory")
    if a.env == "experiment":
        validate_agent_budget(c)
        validate_family(c, None)
        validate_pool_size(c)
        validate_sandboxes(c)
        if str(a.init_from):     # made by experiments/rl_async.py with rl.py's SFT stage if missing
            validate_sft(c)
    elif str(a.init_from) and not pathlib.Path(str(a.init_from)).is_dir():
        raise ConfigError(f"async_.init_from={a.init_from!r}: no such checkpoint directory")
    if served:                                 # last: the only check that talks to something
        loop_dir = pathlib.Path(str(a.run_dir)) / str(a.compare[0])
        remote.probe(c, tokenizer_from_config(c), weights=f"{data_root(c, loop_dir)}/weights")
