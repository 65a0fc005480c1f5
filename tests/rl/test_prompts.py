"""Single-epoch prompt sampler with hard-prompt oversampling (docs/SPEC.md §4)."""

import json

import numpy as np
import pytest

from horizon.rl.runtime.prompts import PromptSampler, sampler_from_config

IDS = [f"p{i:03d}" for i in range(50)]


def drain(s, n, start_step=0):
    out, step = [], start_step
    while s.remaining:
        out += s.sample(n, step)
        step += 1
    return out, step


def test_full_epoch_each_prompt_exactly_once():
    s = PromptSampler(IDS, seed=0)
    out, _ = drain(s, 7)
    assert sorted(out) == sorted(IDS) and len(out) == len(IDS)
    assert s.sample(7, 99) == [] and s.remaining == 0
    assert out != IDS  # shuffled


def test_resume_from_checkpoint_never_repeats():
    fam = {p: ("hard" if i % 5 == 0 else "easy") for i, p in enumerate(IDS)}
    mk = lambda: PromptSampler(IDS, seed=3, families=fam, hard_start_step=2, hard_weight=2.0)  # noqa: E731
    ref = mk()
    ref_out = ref.sample(6, 0) + ref.sample(6, 1)
    for p in ref_out:
        ref.record_rollout(p, turns=10 if fam[p] == "hard" else 2, thinking_tokens=100)
    a = mk()
    first = a.sample(6, 0) + a.sample(6, 1)
    for p in first:
        a.record_rollout(p, turns=10 if fam[p] == "hard" else 2, thinking_tokens=100)
    state = json.loads(json.dumps(a.state_dict()))  # must survive a JSON round trip
    b = PromptSampler.from_state_dict(state)
    rest_b, _ = drain(b, 6, start_step=2)
    rest_ref, _ = drain(ref, 6, start_step=2)
    assert first == ref_out and rest_b == rest_ref  # resumed run == uninterrupted run
    assert sorted(first + rest_b) == sorted(IDS)     # and still a single epoch


def test_hard_prompts_oversampled_after_start_step():
    fam = {p: ("hard" if i < 10 else "easy") for i, p in enumerate(IDS)}
    counts_early, counts_late = [], []
    for seed in range(20):
        s = PromptSampler(IDS, seed=seed, families=fam, hard_start_step=5, hard_weight=3.0)
        s.record_rollout("p000", turns=20, thinking_tokens=500)   # profiled hard prompt (family "hard")
        s.record_rollout("p010", turns=2, thinking_tokens=50)     # profiled easy prompt
        early = s.sample(5, 0)
        late = s.sample(5, 5)
        counts_early.append(sum(fam[p] == "hard" for p in early))
        counts_late.append(sum(fam[p] == "hard" for p in late))
    # uniform: E[hard] = 5 * 10/50 = 1 per batch; exp(3 * (h-1)) with h_hard ~ 1.8 gives ~ 4x odds
    assert np.mean(counts_early) < 1.6
    assert np.mean(counts_late) > 2.5
    s = PromptSampler(IDS, seed=0, families=fam)
    s.record_rollout("p000", turns=20, thinking_tokens=500)
    s.record_rollout("p010", turns=2, thinking_tokens=50)
    s.record_rollout("p002", turns=10, thinking_tokens=250)
    assert s.hardness("p001") > 1.0 > s.hardness("p011")   # unseen prompts inherit family stats
    assert s.hardness("p000") > s.hardness("p001")          # own stats take precedence


def test_zero_weight_is_uniform_and_config_builder():
    import pathlib

    from horizon.utils.config import load_config_file

    c = load_config_file(pathlib.Path(__file__).resolve().parents[2] / "configs" / "rl_tiny.py")
    s = sampler_from_config(IDS, c.rl, seed=1)
    assert not s.oversampling(10 ** 6)  # default config: oversampling off
    with pytest.raises(ValueError):
        PromptSampler(IDS + ["p000"], seed=0)
    with pytest.raises(ValueError):
        PromptSampler(IDS, seed=0, hard_weight=-1)
    with pytest.raises(KeyError):
        PromptSampler(IDS, seed=0).record_rollout("nope", turns=1, thinking_tokens=1)
