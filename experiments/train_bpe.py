"""Train the repo's own byte-level BPE tokenizer: no download, same corpus as pretraining.

    .venv/bin/python experiments/train_bpe.py --config=configs/tiny.py [--vocab 1024] [--out PATH]

The corpus is the pretraining corpus of the config (`data.sources` / `data.extensions` under
`data.root`, train split), so held-out files stay unseen. The tokenizer has horizon's chat specials
(`horizon.data.tokenizer.CHAT_SPECIALS`) as ids 0..7 and is written as a `tokenizers` JSON file
(`model.tokenizer` accepts it). Prints the vocabulary size and the compression against bytes on
the held-out split, and on one config-edit prompt and tool call (what configs/rl_tiny_bpe.py's
budgets are derived from).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from horizon.data import sources
from horizon.data.tokenizer import load_tokenizer, train_bpe
from horizon.train.lm import validate_train_config
from horizon.utils import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "envs" / "tokenizers" / "bpe1024.json"


def corpus(c, split: str) -> list[str]:
    return [text for _, text in sources.file_source(c.data, split)]


def rl_tiny_sample(bpe) -> dict:
    """Token counts of configs/rl_tiny.py's first task (rendered context + its one-call solution)
    under `bpe` and the byte tokenizer: the numbers configs/rl_tiny_bpe.py's budgets come from."""
    from horizon.agent import Message, render  # noqa: PLC0415
    from horizon.agent.prompt import task_text  # noqa: PLC0415
    from horizon.data.tokenizer import ByteTokenizer  # noqa: PLC0415
    from horizon.env.families import family_from_config  # noqa: PLC0415
    from horizon.tools.format import render_call  # noqa: PLC0415
    from horizon.utils.config import load_config_file  # noqa: PLC0415

    fam = family_from_config(load_config_file(ROOT / "configs" / "rl_tiny.py").exp)
    task = fam.make_task(0)
    call = render_call(task.solution[0]["name"], task.solution[0]["args"])
    msgs = [Message("system", fam.system_prompt, kind="system"), Message("user", task_text(task), kind="task")]
    out = {}
    for name, tok in (("context", bpe), ("context_bytes_tok", ByteTokenizer())):
        out[name if name == "context" else "context_bytes"] = len(render(msgs, tok, add_generation_prompt=True).tokens)
    out["context_tokens"] = out.pop("context")
    out["call_bytes"], out["call_tokens"] = len(call.encode("utf-8")) + 1, len(bpe.encode(call)) + 1
    return out


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args, rest = ap.parse_known_args(argv)
    c = cli.load(rest, default=str(ROOT / "configs" / "tiny.py"), validate=validate_train_config, doc=__doc__)
    t0 = time.time()
    train = corpus(c, "train")
    print(f"corpus: {len(train)} files, {sum(len(t) for t in train) / 1e6:.2f} MB of text ({c.data.sources})",
          flush=True)
    tok = train_bpe(train, args.vocab)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    bpe = load_tokenizer(str(out))
    held = corpus(c, "heldout")
    n_bytes = sum(len(t.encode("utf-8")) for t in held)
    n_tok = sum(len(bpe.encode(t)) for t in held)
    sample = rl_tiny_sample(bpe)
    stats = dict(vocab=bpe.vocab_size, heldout_bytes_per_token=n_bytes / max(n_tok, 1), **sample,
                 seconds=time.time() - t0)
    print(f"wrote {out}: {bpe.vocab_size} ids; held-out code {stats['heldout_bytes_per_token']:.2f} bytes/token; "
          f"configs/rl_tiny.py episode: context {sample['context_bytes']} bytes -> {sample['context_tokens']} tokens, "
          f"tool call {sample['call_bytes']} bytes -> {sample['call_tokens']} tokens ({stats['seconds']:.1f}s)",
          flush=True)
    return stats


if __name__ == "__main__":
    main()
