"""The self-summarization study's pieces (docs/SPEC.md §6; experiments/selfsum.py): demonstration
chains per context strategy with an equal share of trained tokens per strategy (`balance_rows`) in
both SFT stages, the stage-1 curriculum, the teacher-forced copy checks after SFT
(`key_copy_check`, `copy_check_lines`), the held-out evaluation that keeps per-episode records
(`study_eval`, `episode_record`; metrics in `horizon.studies.selfsum_metrics`), the per-seed run
(`run_seed`), the quick mode (`apply_quick`), validation (`validate_study`), and the result table
and figure."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import pathlib
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.agent import split_turns
from horizon.agent.summarize import STRATEGIES, SUMMARIZING
from horizon.env.demos import FINAL_MASKS, key_recall_demos, ordered_keys
from horizon.env.families import family_from_config
from horizon.eval import harness
from horizon.model import transformer
from horizon.rl.runtime import checks
from horizon.sandbox import open_sandbox
from horizon.studies import selfsum_metrics as sm
from horizon.tasks import key_recall
from horizon.utils.config import ConfigError, deep_merge, need, need_float, need_int

STUDY_FAMILIES = ("key_recall", "key_relay")


def with_strategy(c, strategy: str):
    """A copy of `c` whose agent runs `strategy`."""
    cs = copy.deepcopy(c)
    cs.agent.context_strategy = strategy
    return cs


def demo_rows(family, c, tok, strategies, corrupt_prob: float, tasks=None, *, per_strategy: bool = False,
              correct_finals_only: bool = False, keep: dict | None = None):
    """Demo segments for each of `strategies` on `tasks` (default: train seeds [0, n_sft_tasks),
    the same tasks for each strategy): one list, or {strategy: rows} with `per_strategy`. `keep`:
    the omission rule (`keep_rule`; None = every fact kept, no memo: the perfect demonstrator)."""
    keep = dict(keep_prob=1.0, memo_keep_prob=0.0) if keep is None else keep
    tasks = family.tasks("train", int(c.exp.n_sft_tasks)) if tasks is None else tasks
    boxes = [open_sandbox(c.exp.demo_backend, c.exp.sandbox_image if c.exp.demo_backend == "docker" else None)
             for _ in range(int(c.exp.demo_sandboxes))]
    pool = ThreadPoolExecutor(len(boxes))          # resets in threads: an exec mostly waits on its process
    try:
        rows = {}
        for s in strategies:
            t0 = time.time()
            rows[s] = key_recall_demos(family, tasks, tok, with_strategy(c, s).agent, boxes, corrupt_prob=corrupt_prob,
                                       seed=int(c.seed), key_alphabet=str(c.exp.task.key_alphabet),
                                       correct_finals_only=correct_finals_only, map_fn=pool.map, **keep,
                                       parallel_prob=float(c.exp.sft.get("parallel_prob", 0.0)), **final_rule(c))
            lossy = (f"lossy memories {corrupt_prob:.2f}" if keep["keep_prob"] >= 1.0 else
                     f"facts kept {keep['keep_prob']:.2f}, memos {keep['memo_keep_prob']:.2f}")
            print(f"demos {s} ({lossy}): {len(tasks)} chains -> {len(rows[s])} segments, "
                  f"{sum(int(m.sum()) for _, m in rows[s])} trained tokens ({time.time() - t0:.0f}s)", flush=True)
        return rows if per_strategy else [r for s in strategies for r in rows[s]]
    finally:
        pool.shutdown()
        for b in boxes:
            b.close()


def final_rule(c) -> dict:
    """`key_recall_demos`' treatment of a wrong final answer from `exp.sft.final_mask`: "turn" (left
    out whole) or "letters" (slot-aligned answers, only the guessed letters left out; design D of
    docs/results/selfsum_rl.md), with the family's slots from `exp.task`."""
    mode = str(c.exp.sft.get("final_mask", "turn"))
    if mode != "letters":
        return dict(final_mask=mode)
    t = c.exp.task
    return dict(final_mask=mode, n_keys=int(t.n_keys), pin_slot=float(t.get("pin_prob", 0.0)) > 0)


def keep_rule(c, stage: str = "sft") -> dict:
    """The lossy-demo omission rule of `exp.sft` (`KeyRecallDemoPolicy`: each new needed fact of a
    memory kept with `keep_prob`, each new memo with `memo_keep_prob`), alike for every strategy;
    the defaults keep every fact and no memo. Stage 1 (`stage="clean"`) uses `clean_keep_prob`
    where set (1.0: every stage-1 answer a correct demonstration, the omission taught in stage 2
    only), else the same rule."""
    s = c.exp.sft
    keep = float(s.get("keep_prob", 1.0))
    if stage == "clean" and s.get("clean_keep_prob") is not None:
        keep = float(s.clean_keep_prob)
    return dict(keep_prob=keep, memo_keep_prob=float(s.get("memo_keep_prob", 0.0)))


def stage1_configs(c) -> list:
    """One config per entry of `exp.sft.clean_mix`, the stage-1 curriculum (name -> overrides:
    ConfigDicts iterate in name order, and a tuple of dicts would not survive the trainer's
    FrozenConfigDict): each entry's `task` overrides merged over `exp.task` and its `agent`
    overrides over the agent section (an empty entry is the experiment's own chains). The mix
    spreads the distance from key.txt's observation to the summary, so that the lookup cannot
    key on the offset: learned on short chains only, the copy did not carry over to the full
    ones (docs/PERF.md)."""
    mixes = c.exp.sft.get("clean_mix") or ml_collections.ConfigDict(dict(full={}))
    if not isinstance(mixes, ml_collections.ConfigDict):
        raise ValueError(f"exp.sft.clean_mix must map names to {{task, agent}} overrides, got {type(mixes).__name__}")
    out = []
    for name, mix in mixes.items():
        unknown = set(mix.keys()) - {"task", "agent"}
        if unknown:
            raise ValueError(f"exp.sft.clean_mix.{name} has unknown keys {sorted(unknown)} (allowed: task, agent)")
        cs = copy.deepcopy(c)
        deep_merge(cs.exp.task, mix.get("task", {}))
        deep_merge(cs.agent, mix.get("agent", {}))
        out.append(cs)
    return out


def balance_rows(rows_by_strategy: dict) -> list:
    """Equal treatment (docs/SPEC.md §6: equal SFT shares): every strategy the same number of trained
    (loss-mask) tokens — each strategy's rows, in order, up to the smallest strategy's total (the row that
    crosses it is kept), so a strategy with longer chains gets fewer chains, not more gradient."""
    tokens = {s: sum(int(np.asarray(m).sum()) for _, m in rows) for s, rows in rows_by_strategy.items()}
    budget = min(tokens.values()) if tokens else 0
    out = []
    for rows in rows_by_strategy.values():
        got = 0
        for r in rows:
            if got >= budget:
                break
            out.append(r)
            got += int(np.asarray(r[1]).sum())
    return out


def warm_start_demos(family, c, tok):
    """`warmstart.two_stage_sft`'s demos, every one of `exp.strategies` with an equal share of trained
    tokens (`balance_rows`) in both stages: stage 1 its own correct chains (finals trained on only
    when right: a sliding window's guess is not a demonstration) on each of the stage-1 task sizes
    (`stage1_configs`), stage 2 on the experiment's tasks with the same `exp.sft.corrupt_prob` share
    of lossy memories for every strategy; with `exp.sft.correct_finals_only` stage 2 too trains a
    final answer only where it is right (a lossy memory's answer is then no demonstration)."""
    strategies = tuple(c.exp.strategies)
    weight = float(c.exp.sft.get("clean_key_weight", 1.0) or 1.0)

    def demos(clean: bool):
        if clean:
            rows = [r for cs in stage1_configs(c) for r in balance_rows(
                demo_rows(family_from_config(cs.exp), cs, tok, strategies, 0.0, per_strategy=True,
                          keep=keep_rule(c, "clean"),
                          correct_finals_only=True))]
            return [weight_key_tokens(t, m, tok, weight) for t, m in rows] if weight != 1.0 else rows
        return balance_rows(demo_rows(family, c, tok, strategies, float(c.exp.sft.corrupt_prob), per_strategy=True,
                                      keep=keep_rule(c),
                                      correct_finals_only=bool(c.exp.sft.get("correct_finals_only", False))))
    return demos


def weight_key_tokens(tokens, mask, tok, weight: float):
    """(tokens, mask) with the loss weight of every trained key-letter token (`key_token_positions`:
    in a summary, a masking note or an answer, of any strategy) multiplied by `weight`: stage 1's
    `exp.sft.clean_key_weight`. Applied after `balance_rows`, to every strategy alike; the copy is
    ~2% of a chain's trained tokens, and its gradient is what forms the lookup (docs/PERF.md). The
    long-horizon family's pin letter is a needed fact too and is weighted alike."""
    m = np.asarray(mask, np.float32).copy()
    text = tok.decode(tokens)
    keys = ordered_keys(text) + key_recall.PIN_RE.findall(text)
    for i in key_token_positions(tokens, m, keys, tok):
        m[i] *= weight
    return tokens, m


@functools.partial(jax.jit, static_argnames=("cfg",))
def _logits(params, tokens, *, cfg):
    return transformer.forward(params, tokens, cfg=cfg)[0]


MEMORY_TAGS = {"summary": ("<summary>", "</summary>"), "note": ("<think>", "</think>")}   # kind -> (open, close)


def memory_kind(before: str) -> str:
    """Where a generated position sits, from the chain text `before` it: inside a ``<summary>``
    ("summary"), inside a ``<think>`` note ("note": observation masking's memory), else "final"."""
    for kind, (o, c) in MEMORY_TAGS.items():
        if before.rfind(o) > before.rfind(c):
            return kind
    return "final"


def key_token_positions(tokens, mask, keys, tok) -> list[int]:
    """Indices of the trained tokens that write a key letter (the letter after `KEY_MARK`), for any
    tokenizer: each token's character span comes from decoding the prefix, so a BPE that merges
    the marker with a space (" #", then "Q") is matched as bytes are. The letter is its own token
    under both of the repo's tokenizers (configs/selfsum_tiny.py); a token that merged it with
    other text would be scored as a whole."""
    ends = np.cumsum([len(tok.decode([int(t)])) for t in tokens])
    text = tok.decode(tokens)
    if len(text) != (ends[-1] if len(ends) else 0):       # not per-token decodable: no positions
        return []
    out = []
    for key in set(keys):
        at = text.find(key_recall.KEY_MARK + key)
        while at >= 0:
            i = int(np.searchsorted(ends, at + len(key_recall.KEY_MARK), side="right"))  # the letter's token
            if 0 < i < len(tokens) and mask[i]:
                out.append(i)
            at = text.find(key_recall.KEY_MARK + key, at + 1)
    return sorted(set(out))


def key_copy_check(params, family, c, tok) -> dict:
    """The SFT gate, without sampling or sandboxes: on clean demo chains of `exp.check_tasks`
    held-out tasks, per strategy, the teacher-forced accuracy of each key's letter where the
    demonstrator writes it — in a summary or a masking note (`memory_kind`: copied from the key's
    observation or an earlier summary) and in the final answer (copied from the memory or the
    observation). Keys `{strategy}_{summary|note|final}_key_acc`. Chance is 1/23 (~0.04); a policy
    that carries the keys through its memory needs both near 1. A segment that holds no key (a
    sliding window's last: its answer is a guess) is not scored. Where a memory holds several keys
    (key_relay), also `{strategy}_{summary|note}_key_acc_m{n}k{j}`: slot j of memories of n keys
    (`memory_slot`)."""
    tasks = family.tasks("heldout", int(c.exp.check_tasks))
    model_cfg = ml_collections.FrozenConfigDict(c.model)             # hashable: one compile per shape per run
    out = {}
    for s in c.exp.strategies:
        hits, slots = {"summary": [], "note": [], "final": []}, {}
        for tokens, mask in demo_rows(family, c, tok, (s,), 0.0, tasks=tasks):
            keys = ordered_keys(tok.decode(tokens))
            if not keys:                                  # the window dropped the keys: the answer is a guess
                continue
            n = len(tokens)
            padded = np.pad(np.asarray(tokens, np.int32), (0, -n % 128))[None]     # few shapes: few compiles
            pred = np.asarray(jnp.argmax(_logits(params, jnp.asarray(padded), cfg=model_cfg), -1))[0]
            for i in key_token_positions(tokens, mask, keys, tok):
                before = tok.decode(tokens[:i])
                kind, hit = memory_kind(before), bool(pred[i - 1] == tokens[i])
                hits[kind].append(hit)
                if kind != "final":
                    slots.setdefault((kind, *memory_slot(before, tok.decode(tokens[i:]))), []).append(hit)
        for kind, h in hits.items():
            if h:
                out[f"{s}_{kind}_key_acc"] = float(np.mean(h))
        if any(n > 1 for _, n, _ in slots):             # several keys in one memory (key_relay): per slot
            out.update({f"{s}_{kind}_key_acc_m{n}k{j}": float(np.mean(h)) for (kind, n, j), h in sorted(slots.items())})
    return out


def memory_slot(before: str, after: str) -> tuple[int, int]:
    """(keys in the memory, this key's 1-based slot) of the key letter that ends `before` and
    starts `after`, inside a summary or note: on key_relay, slot 1 of a 2-key summary is the key
    carried from the previous summary, slot 2 the one read since (where a copy is lost)."""
    o = max(before.rfind(op) for op, _ in MEMORY_TAGS.values())
    close = [x for x in (after.find(cl) for _, cl in MEMORY_TAGS.values()) if x >= 0]
    body = before[o:] + after[:min(close) if close else len(after)]
    slot = len(key_recall.KEY_RE.findall(before[o:] + after[:1]))
    return len(key_recall.KEY_RE.findall(body)), slot


def copy_check_lines(chk: dict, strategies, threshold: float) -> list[str]:
    """The post-SFT copy checks as printed lines, one per strategy: key-in-memory (summary, or
    masking's note) and answer-copy accuracy ("n/a" where the strategy writes none), and whether a
    summarizing strategy's key-in-summary reaches `threshold` (the study's post-SFT gate)."""
    lines = []
    for s in strategies:
        mem = chk.get(f"{s}_summary_key_acc", chk.get(f"{s}_note_key_acc"))
        ans = chk.get(f"{s}_final_key_acc")
        f = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
        gate = "" if s not in SUMMARIZING else (" ok" if mem is not None and mem >= threshold
                                                 else f" BELOW {threshold:.2f}")
        lines.append(f"{s}: key in memory {f(mem)}{gate}, answer copy {f(ans)}")
    return lines


def copy_probe(family, c, tok):
    """The SFT probe (`warmstart.two_stage_sft`'s `probe`, every `exp.sft.probe_every` steps):
    `key_copy_check` of every strategy on `exp.sft.probe_tasks` held-out chains of the
    experiment's own tasks, so the log shows when each copy forms (docs/PERF.md)."""
    cs = copy.deepcopy(c)
    cs.exp.check_tasks = int(c.exp.sft.get("probe_tasks", c.exp.check_tasks))
    return lambda params: key_copy_check(params, family, cs, tok)


# ----------------------------------------------------------------------------- held-out eval, per episode
def episode_record(ep, solved: bool, strategy: str, seed: int, tok) -> dict:
    """`selfsum_metrics`' record of one finished `Episode` (module docstring there): the memory of
    a summarizing strategy is its last summary's text; of the others, the final context without the
    answer turn. Needed facts: the task's `metadata["facts"]` that the chain held before its last
    segment. The record keeps the final answer, the expected one and the last summary's text, so a
    study's ledger shows what a summary kept and what the answer made of it (docs/RESULTS.md)."""
    facts = list(ep.task.metadata.get("facts", ()))
    before = "".join(tok.decode(seg.tokens) for seg in ep.segments[:-1])
    msgs = ep.messages[:-1] if ep.end_reason == "final" else ep.messages
    if strategy in SUMMARIZING:
        memory = next((m.text for m in reversed(ep.messages) if m.kind == "summary"), "")
    else:
        memory = "\n".join(tok.decode(m.tokens) if m.tokens is not None else m.text for m in msgs)
    gen = int(ep.generated_tokens)
    pairs = summary_pairs(ep.segments, tok) if strategy in SUMMARIZING else []
    carry = sm.memory_carry(pairs, facts, list(ep.task.metadata.get("distractors", ())))
    return dict(carry, strategy=strategy, seed=int(seed), task_id=str(ep.task.id), solved=bool(solved),
                final_answer=str(ep.final_answer), expected=str(ep.task.final_answer),
                last_summary=pairs[-1][1] if pairs else "",
                end_reason=ep.end_reason, generated_tokens=gen, summaries=int(ep.stats["summaries"]),
                summary_tokens=int(ep.stats["summary_tokens"]), rewrites=len(ep.segments) - 1,
                prefill_tokens=sm.prefill_tokens([seg.tokens for seg in ep.segments], gen),
                compaction_error=sm.compaction_error(solved, [f for f in facts if f in before], memory))


def summary_pairs(segments, tok) -> list[tuple[str, str]]:
    """(context before the summary, the summary) of every summary turn: the last turn of each segment
    but the last (a summarizing strategy's rewrite follows its summary)."""
    out = []
    for seg in segments[:-1]:
        turns = split_turns(seg.tokens, tok)
        if turns and turns[-1][0] == "assistant":
            out.append(("\n".join(t for _, t in turns[:-1]), turns[-1][1]))
    return out


def study_eval(policy, env, tasks, c, tok, *, strategy: str, seed: int) -> dict:
    """`c.exp.eval.passes` passes of `policy` over `tasks` through the eval harness in `env`'s pooled
    sandboxes (as `loop.evaluate`), keeping each episode (`episode_fn` hook) for `episode_record`:
    `harness.pass_summary`'s numbers plus `episodes` (records in the harness's order, pass index
    added) and `engine_prefill_tokens` (the rollout engine's own count, when the policy has one)."""
    setup = harness.pooled_setup(env, tok, int(c.exp.eval.passes))
    made, build = [], setup.episode_fn
    setup = dataclasses.replace(setup, episode_fn=lambda t, sb: made.append(build(t, sb)) or made[-1])
    records = harness.run_eval(policy, tasks, setup, policy_name=strategy)
    pool: dict = {}
    for ep in made:
        if ep.end_reason != "infra":
            pool.setdefault(str(ep.task.id), []).append(ep)
    eps = []
    for r in records:             # the harness keeps its job order; an episode it retried is matched by task
        ep = pool[r["task_id"]].pop(0)
        eps.append(dict(episode_record(ep, r["solved"], strategy, seed, tok), pass_index=int(r["pass_index"])))
    state = getattr(policy, "state", None) or {}
    return dict(harness.pass_summary(records), episodes=eps, engine_prefill_tokens=state.get("prefill_tokens"))


def study_evaluator(env, tasks, c, tok, *, strategy: str, policy_fn):
    """`run_rl`'s eval hook for the study: `study_eval` of `policy_fn(params, step)` (the driver
    passes `loop.evaluate`'s policy: `policy.rollout_policy` at ``fold_in(run_keys(seed)["eval"],
    step)``; the env layer does not import the RL runtime)."""
    return lambda params, step: study_eval(policy_fn(params, step), env, tasks, c, tok, strategy=strategy,
                                           seed=int(c.seed))


def run_tag(seed: int, strategy: str) -> str:
    """The run name of one strategy's RL in a seed (`loop.run_rl`'s `tag`, its records' "run")."""
    return f"seed {seed} {strategy}"


def logged_results(path, seed: int, strategies, steps: int) -> dict:
    """{strategy: {"start": eval, "end": eval}} for each of `strategies` whose run logged both its
    step-0 and its step-`steps` eval (`loop.run_rl`'s records, run "run" = `run_tag`) in the
    seed's metrics.jsonl `path`; the last record of a step wins. A rerun of a killed study takes a
    finished strategy from here instead of running it again, and a strategy whose RL resumed from
    its checkpoint (no new step-0 eval) still gets its start (nothing lost). Where the run also
    logged an oracle-summary eval (phase "oracle_eval", `selfsum_runs.oracle_eval`) it is "oracle"."""
    p = pathlib.Path(path)
    got: dict = {}
    for line in p.read_text().splitlines() if p.exists() else ():
        rec = json.loads(line)
        if rec.get("phase") == "eval":
            got[(rec.get("run"), int(rec["step"]))] = rec
        elif rec.get("phase") == "oracle_eval":
            got[(rec.get("run"), "oracle")] = rec
    out = {}
    for s in strategies:
        tag = run_tag(seed, s)
        start, end = got.get((tag, 0)), got.get((tag, int(steps)))
        if start is not None and end is not None:
            out[s] = {"start": start, "end": end, "oracle": got.get((tag, "oracle"))}
    return out


# ----------------------------------------------------------------------------- config: quick mode, validation
def apply_quick(c) -> None:
    """`exp.quick=True`: merge `exp.quick_overrides` (sections -> fields, from the config file)
    over the config before validation (`cli.load`'s `derive`); the fields it names take its values."""
    if bool(c.exp.get("quick", False)):
        over = ml_collections.ConfigDict(c.exp.quick_overrides.to_dict())
        for section, fields in over.items():
            deep_merge(c[section], fields)


def validate_config(c) -> None:
    """The study drivers' `cli.load` validation (experiments/selfsum.py, benchmarks/selfsum_scope.py):
    `rl.runtime.checks.validate_experiment`, then `validate_study`."""
    checks.validate_experiment(c, None)
    validate_study(c)


def validate_study(c) -> None:
    """The study's own fields (after `rl.runtime.checks.validate_experiment`): a study family, every strategy
    known and once, self-summary among them (the paired differences' baseline), >= 1 distinct
    non-negative seed, the report's bootstrap and copy-check settings."""
    e = c.exp
    need(e.env in STUDY_FAMILIES, "exp.env", e.env, f"must be one of {STUDY_FAMILIES}")
    st = tuple(e.strategies)
    need(len(set(st)) == len(st) and set(st) <= set(STRATEGIES), "exp.strategies", st,
         f"each of {STRATEGIES} at most once")
    need("self_summary" in st, "exp.strategies", st, "must include self_summary (the paired baseline)")
    seeds = tuple(e.seeds)
    need(len(seeds) > 0 and len(set(seeds)) == len(seeds) and all(isinstance(x, int) and x >= 0 for x in seeds),
         "exp.seeds", seeds, "must be distinct non-negative ints, at least one")
    r = e.report
    need_int(r, "bootstrap_samples", "exp.report", lo=100)
    need_float(r, "ci_level", "exp.report", 0.0, 1.0, lo_open=True)
    need(float(r.ci_level) < 1.0, "exp.report.ci_level", r.ci_level, "must be below 1")
    need_int(r, "bootstrap_seed", "exp.report", lo=0)
    need_float(r, "copy_threshold", "exp.report", 0.0, 1.0)
    if not isinstance(e.get("quick", False), bool):
        raise ConfigError(f"exp.quick={e.quick!r}: must be True or False")
    if not isinstance(e.get("oracle", False), bool):
        raise ConfigError(f"exp.oracle={e.oracle!r}: must be True or False")
    trig = tuple(e.get("triggers", ()))
    need(all(isinstance(t, int) and 0 < t < int(c.agent.max_context_tokens) for t in trig), "exp.triggers", trig,
         f"must be ints in (0, agent.max_context_tokens={c.agent.max_context_tokens})")
    for k in ("keep_prob", "memo_keep_prob", "clean_keep_prob"):
        if e.sft.get(k) is not None:
            need_float(e.sft, k, "exp.sft", 0.0, 1.0)
    if not isinstance(e.sft.get("correct_finals_only", False), bool):
        raise ConfigError(f"exp.sft.correct_finals_only={e.sft.correct_finals_only!r}: must be True or False")
    need(e.sft.get("final_mask", "turn") in FINAL_MASKS, "exp.sft.final_mask", e.sft.get("final_mask"),
         f"must be one of {FINAL_MASKS}")
    need(e.sft.get("final_mask", "turn") != "letters" or bool(e.task.get("slot_alphabets", False)),
         "exp.sft.final_mask", "letters", "needs exp.task.slot_alphabets=True (a letter's slot is its alphabet)")


# ----------------------------------------------------------------------------- report
def study_rows(results: dict, r) -> dict:
    """{strategy: `selfsum_metrics.strategy_row` of its after-RL episodes over every seed, plus
    `sft_success` (mean over seeds of the step-0 eval)}. `results`: {seed: {strategy: {"start",
    "end"}}} (evals with `episodes`); `r`: the `exp.report` section."""
    strategies = list(dict.fromkeys(s for per in results.values() for s in per))
    recs = {s: [e for per in results.values() if s in per for e in per[s]["end"]["episodes"]] for s in strategies}
    rows = {}
    for s in strategies:
        rows[s] = sm.strategy_row(recs[s], baseline=None if s == "self_summary" else recs.get("self_summary"),
                                  samples=int(r.bootstrap_samples), level=float(r.ci_level), seed=int(r.bootstrap_seed))
        rows[s]["sft_success"] = float(np.mean([per[s]["start"]["heldout_mean"]
                                                for per in results.values() if s in per]))
    return rows


def _f(x, fmt="{:.3f}"):
    return "n/a" if x is None else fmt.format(x)


def table(rows: dict, level: float) -> str:
    """The study's markdown table (docs/SPEC.md §6 metrics) and its findings against self-summary."""
    pct = f"{level:.0%}"
    head = (f"| strategy | success, SFT policy | success after RL [{pct} CI] | paired diff vs self-summary, per seed "
            "| compaction-caused errors (share) | tokens per summary | generated tokens per solved task "
            "| prefill tokens per episode | summaries per episode | summaries per solved episode "
            "| context rewrites per episode |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for s, x in rows.items():
        diff = "—" if x["paired_diff"] is None else " ".join(f"{v:+.3f}" for v in x["paired_diff"].values())
        lines.append(f"| {s} | {_f(x['sft_success'])} | {_f(x['success'])} [{_f(x['ci_lo'])}, {_f(x['ci_hi'])}] "
                     f"| {diff} | {x['compaction_errors']} ({_f(x['compaction_error_rate'])}) "
                     f"| {_f(x['tokens_per_summary'], '{:.0f}')} "
                     f"| {_f(x['gen_tokens_per_solved'], '{:.0f}')} | {_f(x['prefill_per_episode'], '{:.0f}')} "
                     f"| {_f(x['summaries_per_episode'], '{:.2f}')} | {_f(x.get('summaries_per_solved'), '{:.2f}')} "
                     f"| {_f(x['rewrites_per_episode'], '{:.2f}')} |")
    return head + "\n".join(lines) + "\n\n" + "\n".join(f"- {k}" for k in findings(rows)) + "\n"


def findings(rows: dict) -> list[str]:
    """The sentences the table must say, whatever the answer: self-summary vs prompt
    compaction in compaction-caused errors and tokens per summary, and where self-summary stands
    against every baseline in success (CI overlap and the sign of the paired differences)."""
    ss, out = rows.get("self_summary"), []
    pc = rows.get("prompt_compaction")
    if ss and pc:
        e1, e2 = ss["compaction_errors"], pc["compaction_errors"]
        out.append(f"compaction-caused errors: self-summary {e1} vs prompt compaction {e2} "
                   f"({'fewer' if e1 < e2 else 'not fewer'}" + (f", {1 - e1 / e2:.0%} fewer" if e2 and e1 < e2 else "")
                   + ")")
        t1, t2 = ss["tokens_per_summary"], pc["tokens_per_summary"]
        out.append(f"tokens per summary: self-summary {_f(t1, '{:.0f}')} vs prompt compaction {_f(t2, '{:.0f}')}"
                   + (f" ({t1 / t2:.2f}x)" if t1 and t2 else ""))
    for s, x in rows.items():
        if ss is None or s == "self_summary":
            continue
        d = list(x["paired_diff"].values())
        if x["ci_hi"] < ss["ci_lo"]:
            verdict = "self-summary better (CIs disjoint)"
        elif x["ci_lo"] > ss["ci_hi"]:
            verdict = "self-summary worse (CIs disjoint)"
        else:
            verdict = "no separation (CIs overlap)"
        out.append(f"success vs {s}: {verdict}; paired diff {s} - self-summary per seed "
                   + " ".join(f"{v:+.3f}" for v in d)
                   + f" ({sum(v < 0 for v in d)}/{len(d)} seeds favour self-summary)")
    return out


def plot(rows: dict, path) -> None:
    """selfsum.png: success after RL per strategy with its CI (and the SFT policy's), and tokens per summary."""
    import matplotlib  # noqa: PLC0415 - heavy, plotting only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - heavy, plotting only
    names = list(rows)
    x = np.arange(len(names))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    a1.bar(x - 0.2, [rows[n]["sft_success"] for n in names], 0.4, label="SFT policy")
    mean = np.asarray([rows[n]["success"] for n in names])
    err = np.asarray([[m - rows[n]["ci_lo"] for n, m in zip(names, mean)],
                      [rows[n]["ci_hi"] - m for n, m in zip(names, mean)]])
    a1.bar(x + 0.2, mean, 0.4, yerr=err, capsize=3, label="after RL (CI)")
    a1.set_xticks(x, names, rotation=20, fontsize=8)
    a1.set_ylabel("held-out success")
    a1.set_ylim(0, 1.05)
    a1.legend()
    a1.set_title("key recall across compactions")
    a2.bar(x, [rows[n]["tokens_per_summary"] or 0 for n in names], 0.5)
    a2.set_xticks(x, names, rotation=20, fontsize=8)
    a2.set_ylabel("tokens per summary (after RL)")
    a2.set_title("summary cost")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
