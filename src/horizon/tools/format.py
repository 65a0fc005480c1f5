"""The text format of an assistant turn, its parser and its renderer (docs/SPEC.md §5).

One assistant turn (the text the model generates before END_TURN) is::

    [<think> free text </think>]            optional scratch thinking
    [free text]                             optional narration (ignored)
    ONE of:
      <function=NAME>
      <parameter=KEY>VALUE</parameter>      zero or more, any order, each KEY once
      </function>                           one tool call (up to `max_calls` of them, only
                                            whitespace between: parallel calls)
      <final>ANSWER</final>                 the final message; ends the episode

A summary turn (answer to the summarize query, docs/SPEC.md §6) is::

    [<think> scratch </think>] <summary> compressed context </summary>

Values are raw text: no JSON escaping, may span lines. One leading and one trailing
newline of a value are stripped (so `<parameter=x>\\nA\\nB\\n</parameter>` is "A\\nB");
`render_call` writes multi-line values that way, which makes `parse(render(x)) == x`
exact. A value ends at the FIRST `</parameter>` after it, so a value cannot contain that
literal (`render_call` refuses such values). Typed values (ints, lists) are rendered as
JSON and converted back by the tool registry from the tool's schema. Text after
`</function>` / `</final>` must be whitespace. The byte-level model emits this format
directly; `parse_action` never raises on any input (errors become `ParseError`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FINAL_OPEN, FINAL_CLOSE = "<final>", "</final>"
SUMMARY_OPEN, SUMMARY_CLOSE = "<summary>", "</summary>"
FUNC_OPEN, FUNC_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
FORMAT_HINT = ("Reply with optional <think>...</think>, then exactly one tool call "
               "<function=NAME><parameter=KEY>VALUE</parameter></function> or a final message <final>...</final>.")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One tool call of a turn: the tool's name and its raw string arguments."""

    name: str
    args: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Action:
    """A parsed assistant turn: tool calls (`kind="call"`) or a final message (`kind="final"`).

    `name` / `args` are the turn's first call; `calls` all of them in order where there are several
    (parallel calls, see the module doc), else (): `tool_calls()` reads either."""

    kind: str                      # "call" | "final"
    name: str = ""                 # tool name (calls)
    args: dict[str, str] = dataclasses.field(default_factory=dict)  # raw string values (calls)
    final: str = ""                # final message (finals)
    thinking: str = ""             # text inside <think>...</think> ("" if none)
    calls: tuple[ToolCall, ...] = ()

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The turn's calls in order (one for a one-call turn, none for a final message)."""
        if self.kind != "call":
            return ()
        return self.calls or (ToolCall(self.name, self.args),)


@dataclasses.dataclass(frozen=True)
class ParseError:
    """Why a turn could not be parsed; `observation()` is what the model sees next."""

    message: str
    thinking: str = ""

    def observation(self) -> str:
        return f"Your action could not be parsed: {self.message}\n{FORMAT_HINT}"


def call_action(calls: list[ToolCall], thinking: str) -> Action:
    """The Action of a turn with `calls` (>= 1; `Action.calls` stays () for one, as a hand-built one-call
    Action has it, so the two compare equal)."""
    return Action("call", name=calls[0].name, args=calls[0].args, thinking=thinking,
                  calls=tuple(calls) if len(calls) > 1 else ())


def too_many_calls(max_calls: int, thinking: str) -> ParseError:
    """The error of a turn with more calls than `max_calls` (a format's shared wording)."""
    if max_calls <= 1:
        return ParseError("only one tool call per turn is allowed", thinking)
    return ParseError(f"at most {max_calls} tool calls per turn are allowed", thinking)


def _strip_value(v: str) -> str:
    if v.startswith("\n"):
        v = v[1:]
    if v.endswith("\n"):
        v = v[:-1]
    return v


def split_thinking(text: str) -> tuple[str, str] | ParseError:
    """(thinking, rest): a leading `<think>...</think>` block, if any, split off."""
    s = text.lstrip()
    if not s.startswith(THINK_OPEN):
        if THINK_CLOSE in s and THINK_OPEN not in s:
            return ParseError("found </think> without an opening <think>")
        return "", text
    end = s.find(THINK_CLOSE)
    if end < 0:
        return ParseError("<think> was never closed with </think>")
    return s[len(THINK_OPEN):end], s[end + len(THINK_CLOSE):]


def _parse_call(body: str, thinking: str) -> tuple[ToolCall, str] | ParseError:
    """One call from `body` (which starts right after `<function=`): the call and the text after
    its `</function>`."""
    gt = body.find(">")
    if gt < 0:
        return ParseError("unterminated <function=NAME> tag (missing '>')", thinking)
    name = body[:gt].strip()
    if not NAME_RE.match(name):
        return ParseError(f"invalid tool name {name[:40]!r} in <function=...>", thinking)
    pos = gt + 1
    args: dict[str, str] = {}
    while True:
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if body.startswith(FUNC_CLOSE, pos):
            return ToolCall(name, args), body[pos + len(FUNC_CLOSE):]
        if body.startswith(PARAM_OPEN, pos):
            kgt = body.find(">", pos)
            if kgt < 0:
                return ParseError("unterminated <parameter=KEY> tag (missing '>')", thinking)
            key = body[pos + len(PARAM_OPEN):kgt].strip()
            if not NAME_RE.match(key):
                return ParseError(f"invalid parameter name {key[:40]!r}", thinking)
            vend = body.find(PARAM_CLOSE, kgt + 1)
            if vend < 0:
                return ParseError(f"parameter {key!r} was never closed with </parameter>", thinking)
            if key in args:
                return ParseError(f"parameter {key!r} given more than once", thinking)
            args[key] = _strip_value(body[kgt + 1:vend])
            pos = vend + len(PARAM_CLOSE)
            continue
        if pos >= len(body):
            return ParseError(f"tool call {name!r} was never closed with </function>", thinking)
        return ParseError(f"expected <parameter=KEY> or </function> in call {name!r}, got "
                          f"{body[pos:pos + 30]!r}", thinking)


def collect_calls(body: str, thinking: str, max_calls: int, one_call, open_tag: str, stray) -> Action | ParseError:
    """The calls of a turn (a format's shared loop): `one_call(body, thinking)` parses the call that starts
    right after `open_tag` into (ToolCall, the text after it) or a ParseError; calls follow one another with
    only whitespace between, at most `max_calls`; `stray(rest)` is the error of other text after a call."""
    calls: list[ToolCall] = []
    while True:
        one = one_call(body, thinking)
        if isinstance(one, ParseError):
            return one
        calls.append(one[0])
        rest = one[1].lstrip()
        if not rest:
            return call_action(calls, thinking)
        if open_tag in rest and len(calls) >= max_calls:
            return too_many_calls(max_calls, thinking)
        if not rest.startswith(open_tag):
            return stray(rest)
        body = rest[len(open_tag):]


def _parse(text: str, max_calls: int = 1) -> Action | ParseError:
    split = split_thinking(text)
    if isinstance(split, ParseError):
        return split
    thinking, rest = split
    if THINK_OPEN in rest:
        return ParseError("only one <think> block is allowed, at the start of the turn", thinking)
    f = rest.find(FUNC_OPEN)
    g = rest.find(FINAL_OPEN)
    if f >= 0 and g >= 0:
        return ParseError("a turn must contain either one tool call or a <final> message, not both", thinking)
    if f >= 0:
        return collect_calls(rest[f + len(FUNC_OPEN):], thinking, max_calls, _parse_call, FUNC_OPEN, lambda tail:
                             ParseError(f"unexpected text after </function>: {tail.strip()[:60]!r}", thinking))
    if g >= 0:
        end = rest.find(FINAL_CLOSE, g)
        if end < 0:
            return ParseError("<final> was never closed with </final>", thinking)
        if rest[end + len(FINAL_CLOSE):].strip():
            return ParseError("unexpected text after </final>", thinking)
        return Action(kind="final", final=rest[g + len(FINAL_OPEN):end].strip(), thinking=thinking)
    if "<function" in rest:
        return ParseError("malformed tool call: write <function=NAME> (with '=')", thinking)
    return ParseError("no tool call and no <final> message found", thinking)


def as_text(text: Any) -> str | ParseError:
    """A turn as text (bytes decoded leniently); anything else is a ParseError."""
    if isinstance(text, bytes):
        return text.decode("utf-8", errors="replace")
    return text if isinstance(text, str) else ParseError(f"expected text, got {type(text).__name__}")


def parse_action(text: Any, max_calls: int = 1) -> Action | ParseError:
    """Parse one assistant turn with up to `max_calls` tool calls. Never raises (any input, any type)."""
    try:
        text = as_text(text)
        if isinstance(text, ParseError):
            return text
        return _parse(text, max_calls)
    except Exception as e:  # defensive: the parser must never take the rollout down
        return ParseError(f"internal parser error: {type(e).__name__}")


def parse_summary(text: Any) -> tuple[str, str] | ParseError:
    """(thinking, summary) from a summary turn. Never raises.

    `<summary>` tags are preferred; without them the text after the thinking block is
    taken as the summary (lenient: a lost summary costs the whole chain).
    """
    try:
        text = as_text(text)
        if isinstance(text, ParseError):
            return text
        split = split_thinking(text)
        thinking, rest = ("", text) if isinstance(split, ParseError) else split
        a = rest.find(SUMMARY_OPEN)
        if a >= 0:
            b = rest.find(SUMMARY_CLOSE, a)
            body = rest[a + len(SUMMARY_OPEN):] if b < 0 else rest[a + len(SUMMARY_OPEN):b]
        else:
            body = rest
        body = body.strip()
        if not body:
            return ParseError("empty summary", thinking)
        return thinking, body
    except Exception as e:
        return ParseError(f"internal parser error: {type(e).__name__}")


def value_to_text(v: Any) -> str:
    """Strings as-is; anything else (ints, lists, dicts, bools) as JSON."""
    return v if isinstance(v, str) else json.dumps(v)


def render_call(name: str, args: dict[str, Any], thinking: str | None = None) -> str:
    """The canonical text of a tool call (scripted policies, SFT demos)."""
    if not NAME_RE.match(name):
        raise ValueError(f"invalid tool name {name!r}")
    parts = [] if thinking is None else [f"{THINK_OPEN}{thinking}{THINK_CLOSE}\n"]
    parts.append(f"{FUNC_OPEN}{name}>\n")
    for k, v in args.items():
        if not NAME_RE.match(k):
            raise ValueError(f"invalid parameter name {k!r}")
        s = value_to_text(v)
        if PARAM_CLOSE in s:
            raise ValueError(f"parameter {k!r} contains the literal {PARAM_CLOSE!r}; not representable")
        if "\n" in s or s.startswith("\n") or s.endswith("\n"):
            s = "\n" + s + "\n"
        parts.append(f"{PARAM_OPEN}{k}>{s}{PARAM_CLOSE}\n")
    parts.append(FUNC_CLOSE)
    return "".join(parts)


def render_final(answer: str, thinking: str | None = None) -> str:
    if FINAL_CLOSE in answer:
        raise ValueError(f"final answer contains {FINAL_CLOSE!r}")
    head = "" if thinking is None else f"{THINK_OPEN}{thinking}{THINK_CLOSE}\n"
    return f"{head}{FINAL_OPEN}{answer}{FINAL_CLOSE}"


def render_summary(summary: str, thinking: str | None = None) -> str:
    head = "" if thinking is None else f"{THINK_OPEN}{thinking}{THINK_CLOSE}\n"
    return f"{head}{SUMMARY_OPEN}\n{summary}\n{SUMMARY_CLOSE}"


# ----------------------------------------------------------------------------- pluggable formats
class ToolCallFormat:
    """A model's tool-call text format: the renderer/parser pair of one assistant turn plus the
    instructions the system prompt shows (docs/SPEC.md §5). `agent.tool_format` names the one an
    `Episode` parses with (`tool_format`); the default, "horizon", is this module's format.

    Interface (subclass and `register_format(...)`):
      * `name`, `instructions` (the system prompt's "Turn format" paragraph);
      * `parse_action(text) -> Action | ParseError` and `parse_summary(text)` — never raise;
      * `render_call(name, args, thinking=None)`, `render_final(answer, thinking=None)`,
        `render_summary(summary, thinking=None)` with ``parse(render(x)) == x``.
    Thinking (`<think>`) and summary (`<summary>`) blocks are shared by every format; the SFT
    demonstrators (`horizon.env.demos`, `horizon.agent.scripted`) write the "horizon" format."""

    name = "horizon"
    instructions = ("Turn format: optionally think inside <think>...</think>, then EITHER one tool call\n"
                    "<function=NAME>\n<parameter=KEY>VALUE</parameter>\n</function>\n"
                    "OR, when you are done, <final>your final message</final>.\n"
                    "Values are raw text (no escaping; they may span lines). Use absolute paths.")

    def parse_action(self, text: Any, max_calls: int = 1) -> Action | ParseError:
        return parse_action(text, max_calls)

    def parse_summary(self, text: Any) -> tuple[str, str] | ParseError:
        return parse_summary(text)

    def render_call(self, name: str, args: dict[str, Any], thinking: str | None = None) -> str:
        return render_call(name, args, thinking)

    def render_calls(self, calls: Sequence[ToolCall], thinking: str | None = None) -> str:
        """Several calls in one turn (parallel calls): the first with the thinking, one per line."""
        head = "" if thinking is None else f"{THINK_OPEN}{thinking}{THINK_CLOSE}\n"
        return head + "\n".join(self.render_call(c.name, c.args) for c in calls)

    def render_final(self, answer: str, thinking: str | None = None) -> str:
        return render_final(answer, thinking)

    def render_summary(self, summary: str, thinking: str | None = None) -> str:
        return render_summary(summary, thinking)


class HermesFormat(ToolCallFormat):
    """The JSON tool-call format of Hermes / Qwen2.5-style chat templates::

        [<think>..</think>] <tool_call>
        {"name": "read_file", "arguments": {"path": "/workspace/a.py"}}
        </tool_call>

    (a final message is plain text, in `<final>` tags so "no call" is explicit). Argument values
    are JSON: strings stay strings, other JSON values are passed on as their JSON text (the tool
    registry converts them by schema, as for the horizon format)."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    instructions = ("Turn format: optionally think inside <think>...</think>, then EITHER one tool call\n"
                    "<tool_call>\n{\"name\": NAME, \"arguments\": {KEY: VALUE, ...}}\n</tool_call>\n"
                    "OR, when you are done, <final>your final message</final>. Use absolute paths.")

    def parse_action(self, text: Any, max_calls: int = 1) -> Action | ParseError:
        try:
            text = as_text(text)
            if isinstance(text, ParseError):
                return text
            split = split_thinking(text)
            if isinstance(split, ParseError):
                return split
            thinking, rest = split
            a = rest.find(self.OPEN)
            if a < 0:
                return parse_action(text)          # a <final> message (or the horizon parser's error)
            return collect_calls(rest[a + len(self.OPEN):], thinking, max_calls, self._parse_block, self.OPEN,
                                 lambda tail: ParseError(f"text after {self.CLOSE}", thinking))
        except Exception as e:  # noqa: BLE001 - the parser must never take the rollout down
            return ParseError(f"internal parser error: {type(e).__name__}")

    def _parse_block(self, body: str, thinking: str) -> tuple[ToolCall, str] | ParseError:
        """One call's JSON from `body` (right after the open tag): the call and the text after its close."""
        b = body.find(self.CLOSE)
        if b < 0:
            return ParseError(f"unterminated {self.OPEN} (missing {self.CLOSE})", thinking)
        try:
            call = json.loads(body[:b])
        except json.JSONDecodeError as e:
            return ParseError(f"tool call is not valid JSON: {e.msg} at char {e.pos}", thinking)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not NAME_RE.match(call["name"]):
            return ParseError('tool call JSON needs {"name": NAME, "arguments": {...}}', thinking)
        args = call.get("arguments", {})
        if not isinstance(args, dict) or not all(isinstance(k, str) and NAME_RE.match(k) for k in args):
            return ParseError("tool call arguments must be an object with identifier keys", thinking)
        return ToolCall(call["name"], {k: value_to_text(v) for k, v in args.items()}), body[b + len(self.CLOSE):]

    def render_call(self, name: str, args: dict[str, Any], thinking: str | None = None) -> str:
        if not NAME_RE.match(name) or not all(NAME_RE.match(k) for k in args):
            raise ValueError(f"invalid tool or parameter name in {name!r} {sorted(args)}")
        head = "" if thinking is None else f"{THINK_OPEN}{thinking}{THINK_CLOSE}\n"
        return f"{head}{self.OPEN}\n{json.dumps({'name': name, 'arguments': args})}\n{self.CLOSE}"


def parallel_calls_rule(max_calls: int) -> str:
    """The system prompt's line that allows parallel calls (`agent.max_parallel_calls` > 1; "" for one)."""
    if max_calls <= 1:
        return ""
    return (f"You may make up to {max_calls} tool calls in one turn, one after another: they run at the same "
            "time and the next message holds each one's result, in order.")


def join_results(calls: Sequence[ToolCall], outputs: Sequence[str]) -> str:
    """The one observation of a turn's calls: a lone call's output as it is; several, each under a
    `[call i: NAME]` header, in the turn's order."""
    if len(calls) == 1:
        return outputs[0]
    return "\n".join(f"[call {i}: {c.name}]\n{out}" for i, (c, out) in enumerate(zip(calls, outputs), 1))


FORMATS: dict[str, ToolCallFormat] = {"horizon": ToolCallFormat(), "hermes": HermesFormat()}


def register_format(fmt: ToolCallFormat) -> None:
    """Make `fmt` selectable as `agent.tool_format = fmt.name`."""
    FORMATS[fmt.name] = fmt


def tool_format(name: str = "horizon") -> ToolCallFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown tool format {name!r}; registered: {', '.join(sorted(FORMATS))}")
    return FORMATS[name]
