"""Non-learned policies that drive the real agent loop (harness checks, SFT demos; docs/SPEC.md §5, §6).

They obey the batched policy interface `policy(contexts, max_new_tokens) -> [Generation]`
and read only the context they are given, like a model would:

- the task is recognised from the first user message (the task prompt);
- progress is read back from the context: each scripted turn starts with
  `<think>[step K]</think>`, and summaries it writes record `Progress: [step K] done`;
  the next turn is step max(K)+1. After a context reset, only what the summary kept
  is known, so a summary that loses progress or facts really costs the episode;
- on the summarize query it writes `<think>..</think><summary>..</summary>` from the
  context text.

`ScriptedPolicy` replays a task's `solution` calls and its `final_answer`.
`RecallScriptedPolicy` does not know the answers: each hidden fact's literal value
(`recall_facts(task)`) in the script becomes a placeholder filled at emission time from
the CURRENT context (the fact's regex, or a `fact NAME = VALUE` line an earlier summary
wrote), and its summaries record every fact visible in the context. So it succeeds when the fact survives compaction
(self_summary) and fails when the fact fell out of the window (sliding_window).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from horizon.agent.prompt import split_turns
from horizon.agent.rollout import Generation
from horizon.agent.summarize import COMPACTION_PROMPT, SUMMARY_QUERY
from horizon.tools.format import render_call, render_final, render_summary

STEP_RE = re.compile(r"\[step (\d+)\]")
UNKNOWN_FACT = "UNKNOWN"
WRITTEN_ARGS = ("file_text", "new_str")   # tool arguments whose text a recall policy must produce itself


def script_from_task(task) -> list[str]:
    """Turn texts (without step markers) for a task: its solution calls, then the final message."""
    turns = [render_call(c["name"], c.get("args", {})) for c in task.solution]
    return turns + [render_final(task.final_answer or "Done.")]


class ScriptedPolicy:
    """Replays fixed turns per task, reading progress and queries from the context. A turn is its
    text, or (thought, text): the thought follows the step marker in the turn's think block."""

    def __init__(self, scripts: dict[str, Sequence[str | tuple[str, str]]], tokenizer, policy_version: int = 0):
        self.scripts = {k.strip(): [t if isinstance(t, tuple) else ("", t) for t in v] for k, v in scripts.items()}
        if not self.scripts:
            raise ValueError("ScriptedPolicy needs at least one script")
        self.tok = tokenizer
        self.policy_version = policy_version
        self.calls = 0

    @classmethod
    def from_tasks(cls, tasks, tokenizer, **kw) -> ScriptedPolicy:
        return cls({t.prompt: script_from_task(t) for t in tasks}, tokenizer, **kw)

    # -- reading the context -----------------------------------------------------------------
    def _script_for(self, turns) -> list[str] | None:
        first_user = next((text for role, text in turns if role == "user"), "")
        best = None
        for prompt, script in self.scripts.items():
            if first_user.startswith(prompt) and (best is None or len(prompt) > len(best[0])):
                best = (prompt, script)
        return None if best is None else best[1]

    @staticmethod
    def _last_step(text: str) -> int:
        steps = [int(m) for m in STEP_RE.findall(text)]
        return max(steps) if steps else -1

    def summary_text(self, context_text: str, last_step: int) -> tuple[str, str]:
        """(thinking, summary) for the summarize query."""
        return (f"The last step I completed is {last_step}.",
                f"Progress: [step {last_step}] done." if last_step >= 0 else "Progress: nothing done yet.")

    def fill(self, turn: str, context_text: str) -> str:
        return turn

    # -- acting ----------------------------------------------------------------------------
    def act(self, context) -> str:
        turns = split_turns(context, self.tok)
        text = "\n".join(t for _, t in turns)
        last_user = next((t for r, t in reversed(turns) if r != "assistant"), "")
        last = self._last_step(text)
        if last_user in (SUMMARY_QUERY, COMPACTION_PROMPT):
            thinking, summary = self.summary_text(text, last)
            return render_summary(summary, thinking=thinking)
        script = self._script_for(turns)
        if script is None:
            return render_final("I do not recognise this task.")
        k = min(last + 1, len(script) - 1)
        thought, turn = script[k]
        return f"<think>[step {k}]{' ' + thought if thought else ''}</think>\n" + self.fill(turn, text)

    def __call__(self, contexts: list, max_new_tokens: int) -> list[Generation]:
        out = []
        for ctx in contexts:
            self.calls += 1
            ids = np.asarray(self.tok.encode(self.act(ctx)) + [self.tok.end_turn_id], np.int32)[:max_new_tokens]
            out.append(Generation(ids, np.zeros(len(ids), np.float32), None, self.policy_version))
        return out


def recall_facts(task) -> dict[str, tuple[str, str]]:
    """name -> (literal value to hide, regex with one capture group that finds it in a context).

    Sources, in order: `metadata["fact_regexes"]` ({name: regex}, literal `metadata[name]`);
    the `horizon.tasks.recall` generator's metadata (`code`, `corrupt_file`);
    `metadata["fact_regex"]` (one fact whose literal is `task.final_answer`).
    """
    md = getattr(task, "metadata", {}) or {}
    if "fact_regexes" in md:
        return {k: (str(md[k]), r) for k, r in md["fact_regexes"].items()}
    if "code" in md and "corrupt_file" in md:
        return {"code": (md["code"], r"signing code is:? ([a-z]+-[a-z]+-[0-9]+)"),
                # the shard whose STATUS line says CORRUPT: its header, then lines without another header
                "corrupt_file": (md["corrupt_file"],
                                 r"# log shard (\S+)\n(?:(?![^\n]*# log shard)[^\n]*\n)*?[^\n]*STATUS: CORRUPT")}
    if "fact_regex" in md and task.final_answer:
        return {"fact": (task.final_answer, md["fact_regex"])}
    raise ValueError(f"task {getattr(task, 'id', '?')} declares no recall facts (see recall_facts)")


class RecallScriptedPolicy(ScriptedPolicy):
    """Follows the solution but must recall hidden facts from its context (see module doc)."""

    def __init__(self, scripts, tokenizer, fact_regexes: dict[str, str], **kw):
        super().__init__(scripts, tokenizer, **kw)
        self.fact_res = {k: re.compile(r) for k, r in fact_regexes.items()}
        for k, r in self.fact_res.items():
            if r.groups < 1:
                raise ValueError(f"fact regex for {k!r} needs a capture group: {r.pattern!r}")

    @classmethod
    def from_tasks(cls, tasks, tokenizer, **kw) -> RecallScriptedPolicy:
        scripts, regexes = {}, {}
        for t in tasks:
            facts = sorted(recall_facts(t).items(), key=lambda kv: -len(kv[1][0]))   # longest literal first

            def hide(text: str, facts=facts) -> str:
                for name, (literal, _) in facts:
                    text = text.replace(literal, placeholder(name))
                return text

            for name, (_, rx) in facts:
                if regexes.setdefault(name, rx) != rx:
                    raise ValueError(f"tasks disagree on the regex of fact {name!r}")
            # facts are hidden only where the policy WRITES them (edited text, final message); paths it
            # reads (e.g. the corrupt shard) stay, so it still follows the solution's exploration
            turns = [render_call(c["name"], {k: hide(v) if k in WRITTEN_ARGS and isinstance(v, str) else v
                                             for k, v in c.get("args", {}).items()}) for c in t.solution]
            scripts[t.prompt] = turns + [render_final(hide(t.final_answer or "Done."))]
        return cls(scripts, tokenizer, fact_regexes=regexes, **kw)

    def facts(self, context_text: str) -> dict[str, str]:
        """Facts visible in the context: found by their regex, or recorded by an earlier summary."""
        out = {}
        for k, r in self.fact_res.items():
            m = r.search(context_text)
            noted = re.search(rf"fact {re.escape(k)} = (\S+)", context_text)
            if m:
                out[k] = m.group(1)
            elif noted:
                out[k] = noted.group(1)
        return out

    def fill(self, turn: str, context_text: str) -> str:
        facts = self.facts(context_text)
        for k in self.fact_res:
            turn = turn.replace(placeholder(k), facts.get(k, UNKNOWN_FACT))
        return turn

    def summary_text(self, context_text: str, last_step: int):
        thinking, summary = super().summary_text(context_text, last_step)
        facts = self.facts(context_text)
        if facts:
            summary += "\nKey facts:\n" + "\n".join(f"- fact {k} = {v}" for k, v in facts.items())
        return thinking + " I must keep the key facts.", summary


def placeholder(name: str) -> str:
    return f"\x00FACT:{name}\x00"
