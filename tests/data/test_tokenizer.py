"""The one tokenizer interface: byte and BPE tokenizers, chat format, HF chat-template parity."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from horizon.agent import Message, render, split_turns
from horizon.data.tokenizer import CHAT_SPECIALS, BPETokenizer, ByteTokenizer, Tokenizer, load_tokenizer, train_bpe

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEXTS = [p.read_text() for p in sorted((ROOT / "src" / "horizon" / "agent").glob("*.py"))]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [Message("system", "You are a coding agent."), Message("user", "Fix  the bug\nin a.py, café ✓"),
            Message("assistant", "<function=read_file>\n<parameter=path>/workspace/a.py</parameter>\n</function>"),
            Message("observation", "x = 1\n\ty = 'ünï'\n"), Message("user", "thanks")]


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe(TEXTS, 512).save(str(p))
    return p


def test_trained_bpe_has_chat_specials_first_and_round_trips_any_text(bpe_file):
    tok = load_tokenizer(str(bpe_file))
    assert isinstance(tok, BPETokenizer) and isinstance(tok, Tokenizer) and tok.vocab_size == 512
    ids = [tok._tok.token_to_id(s) for s in CHAT_SPECIALS.values()]
    assert ids == list(range(len(CHAT_SPECIALS)))
    text = "def f(x):\n    return x  # ünï ✓ \x01 <|end|>"
    enc = tok.encode(text)
    assert tok.decode(enc) == text and tok.end_turn_id not in enc     # specials are never parsed from text
    assert len(enc) < len(text.encode())                              # it compresses
    assert tok.stop_ids == (tok.end_turn_id, tok.eos_id)


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_render_and_split_turns_use_the_tokenizers_pieces(kind, bpe_file):
    tok = ByteTokenizer() if kind == "byte" else load_tokenizer(str(bpe_file))
    r = render(MESSAGES, tok, add_generation_prompt=True)
    want = list(tok.context_start())
    for m in MESSAGES:
        want += tok.turn_open(m.role) + tok.encode(m.text) + tok.turn_close(m.role)
    assert r.tokens.tolist() == want + tok.turn_open("assistant")
    assert split_turns(r.tokens, tok) == [(m.role, m.text) for m in MESSAGES] + [("assistant", "")]
    # a generated assistant turn: the stop id is trained on, the closing piece after it is not
    gen = np.asarray(tok.encode("<final>done</final>") + [tok.end_turn_id], np.int32)
    r2 = render(MESSAGES[:2] + [Message("assistant", tokens=gen, logprobs=np.full(len(gen), -0.5, np.float32))], tok)
    assert r2.tokens[r2.loss_mask].tolist() == gen.tolist() and r2.loss_mask.sum() == len(gen)


def test_byte_tokenizer_layout_is_unchanged():
    tok = ByteTokenizer()
    r = render(MESSAGES[:2], tok, add_generation_prompt=True)
    assert r.tokens[0] == tok.BOS and r.tokens[1] == tok.SYSTEM and r.tokens[-1] == tok.ASSISTANT
    assert (r.tokens == tok.END_TURN).sum() == 2


def test_chat_template_rendering_equals_transformers_apply_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTok

    t = train_bpe(TEXTS, 400)
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<|im_start|>", "<|im_end|>")])
    t.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict(chat_template=CHATML, eos_token="<|im_end|>")))
    ours = load_tokenizer(str(tmp_path))
    assert ours.end_turn_id == HFTok.from_file(str(tmp_path / "tokenizer.json")).token_to_id("<|im_end|>")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), chat_template=CHATML)
    role = {"observation": "tool"}
    msgs = [{"role": role.get(m.role, m.role), "content": m.text} for m in MESSAGES]
    theirs = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert render(MESSAGES, ours, add_generation_prompt=True).tokens.tolist() == list(theirs)
    assert split_turns(render(MESSAGES, ours).tokens, ours) == [(m.role, m.text) for m in MESSAGES]


def test_bad_tokenizers_fail_with_one_line(tmp_path):
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models

    HFTok(models.BPE()).save(str(tmp_path / "plain.json"))
    with pytest.raises(ValueError, match="lacks horizon's chat special tokens"):
        load_tokenizer(str(tmp_path / "plain.json"))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path / "missing"))
    from horizon.data.tokenizer import validate_tokenizer
    from horizon.utils.config import ConfigError, load_config_file

    c = load_config_file(ROOT / "configs" / "rl_tiny_bpe.py")
    c.model.vocab_size = 1000
    with pytest.raises(ConfigError, match=r"model.tokenizer=.*1024 ids but model.vocab_size=1000"):
        validate_tokenizer(c.model)


def test_rl_tiny_bpe_budgets_fit_the_measured_episode():
    """configs/rl_tiny_bpe.py's budgets hold its first task's context + one-call solution (the numbers
    its docstring quotes, recomputed here from the checked-in tokenizer)."""
    from horizon.agent.prompt import task_text
    from horizon.env.families import family_from_config
    from horizon.tools.format import render_call
    from horizon.utils.config import load_config_file

    c = load_config_file(ROOT / "configs" / "rl_tiny_bpe.py")
    tok = load_tokenizer(c.model.tokenizer, c.model.vocab_size)
    fam = family_from_config(c.exp)
    for seed in range(8):
        task = fam.make_task(seed)
        ctx = render([Message("system", fam.system_prompt), Message("user", task_text(task))], tok,
                     add_generation_prompt=True).tokens
        call = tok.encode(render_call(task.solution[0]["name"], task.solution[0]["args"])) + [tok.end_turn_id]
        assert len(call) <= c.agent.max_new_tokens and len(ctx) + len(call) <= c.exp.sft.seq_len
        assert len(ctx) + c.agent.max_new_tokens <= c.agent.max_context_tokens <= c.model.max_seq_len
