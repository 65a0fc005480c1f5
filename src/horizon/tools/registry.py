"""Tool specs, per-environment tool sets and argument checking (docs/SPEC.md §5).

A `Tool` is a name, a schema (`Param`s) and a function `fn(ctx, **args) -> str` that
acts only through the `Sandbox` protocol. `ToolRegistry(tools, strict)` is one
environment's tool set: strict mode (training) rejects unknown arguments and values of
the wrong type with an error observation; lenient mode drops unknown arguments and
coerces loosely. Nothing here raises on model input: every failure becomes observation
text (`ToolResult.error=True`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from horizon.sandbox.base import TRUNCATION_MARKER, Sandbox, SandboxInfraError, SandboxResourceError

PARAM_TYPES = ("str", "int", "list", "bool")


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    type: str = "str"                  # one of PARAM_TYPES
    required: bool = True
    description: str = ""
    enum: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.type not in PARAM_TYPES:
            raise ValueError(f"Param {self.name!r}: type must be one of {PARAM_TYPES}, got {self.type!r}")


@dataclasses.dataclass
class ToolState:
    """Per-episode state the tools keep (todo list and its counters for docs/SPEC.md §4 rewards)."""

    todos: list[dict] = dataclasses.field(default_factory=list)      # current list
    todo_status: dict[str, str] = dataclasses.field(default_factory=dict)  # content -> last status, ever seen

    @property
    def todos_created(self) -> int:
        return len(self.todo_status)

    @property
    def todos_completed(self) -> int:
        return sum(s == "completed" for s in self.todo_status.values())

    def remaining_todos(self) -> list[str]:
        return [t["content"] for t in self.todos if t.get("status") != "completed"]


@dataclasses.dataclass
class ToolContext:
    """What a tool may touch: the sandbox, the episode's tool state and the limits."""

    sandbox: Sandbox
    state: ToolState
    timeout_s: float = 30.0            # default run_shell timeout
    max_timeout_s: float = 120.0       # cap on a model-requested timeout
    max_observation_bytes: int = 8192


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...]
    fn: Callable[..., str]

    def spec_text(self) -> str:
        lines = [f"- {self.name}: {self.description}"]
        for p in self.params:
            req = "required" if p.required else "optional"
            enum = f", one of {list(p.enum)}" if p.enum else ""
            lines.append(f"    <parameter={p.name}> ({p.type}, {req}{enum}) {p.description}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ToolResult:
    output: str
    error: bool = False


class ToolArgError(ValueError):
    pass


def truncate_text(text: str, max_bytes: int) -> str:
    """Keep head and tail of `text` within ~`max_bytes` UTF-8 bytes, with a visible marker."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text
    head = max_bytes // 2
    tail = max_bytes - head
    omitted = len(data) - head - tail
    return (data[:head].decode("utf-8", errors="ignore") + TRUNCATION_MARKER.format(omitted=omitted)
            + data[len(data) - tail:].decode("utf-8", errors="ignore"))


def _coerce(p: Param, v: Any, strict: bool) -> Any:
    """Convert a raw (usually string) value to the param's type, or raise ToolArgError."""
    if p.type == "str":
        if not isinstance(v, str):
            if strict:
                raise ToolArgError(f"parameter {p.name!r} must be a string")
            v = json.dumps(v)
    elif p.type == "int":
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise ToolArgError(f"parameter {p.name!r} must be an integer, got {v!r:.40}")
        if isinstance(v, str):
            s = v.strip() if not strict else v
            try:
                v = int(s)
            except ValueError:
                raise ToolArgError(f"parameter {p.name!r} must be an integer, got {v!r:.40}") from None
    elif p.type == "bool":
        if isinstance(v, str):
            s = v.strip().lower()
            if s in ("true", "1", "yes") if not strict else s == "true":
                v = True
            elif s in ("false", "0", "no") if not strict else s == "false":
                v = False
            else:
                raise ToolArgError(f"parameter {p.name!r} must be true or false, got {v!r:.40}")
        elif not isinstance(v, bool):
            raise ToolArgError(f"parameter {p.name!r} must be true or false")
    elif p.type == "list":
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except (ValueError, RecursionError):
                raise ToolArgError(f"parameter {p.name!r} must be a JSON list") from None
        if not isinstance(v, list):
            raise ToolArgError(f"parameter {p.name!r} must be a JSON list")
    if p.enum is not None and v not in p.enum:
        raise ToolArgError(f"parameter {p.name!r} must be one of {list(p.enum)}, got {v!r:.40}")
    return v


class ToolRegistry:
    """One environment's tool set. `execute` never raises on model input."""

    def __init__(self, tools: Sequence[Tool], strict: bool = True):
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate tool names in {names}")
        self.tools = {t.name: t for t in tools}
        self.strict = bool(strict)

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def spec_text(self) -> str:
        return "\n".join(t.spec_text() for t in self.tools.values())

    def check_args(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Validated, typed kwargs for tool `name`, or ToolArgError with a clear message."""
        tool = self.tools[name]
        known = {p.name: p for p in tool.params}
        unknown = [k for k in args if k not in known]
        if unknown and self.strict:
            raise ToolArgError(f"unknown parameter(s) {unknown} for tool {name!r}; "
                               f"allowed: {list(known)}")
        out = {}
        for p in tool.params:
            if p.name in args:
                out[p.name] = _coerce(p, args[p.name], self.strict)
            elif p.required:
                raise ToolArgError(f"missing required parameter {p.name!r} for tool {name!r}")
        return out

    def execute(self, name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if name not in self.tools:
            return ToolResult(f"Error: unknown tool {name!r}. Available tools: {self.names}", error=True)
        try:
            kwargs = self.check_args(name, args)
        except ToolArgError as e:
            return ToolResult(f"Error: {e}", error=True)
        try:
            out = self.tools[name].fn(ctx, **kwargs)
            error = False
        except ToolArgError as e:
            out, error = f"Error: {e}", True
        except (SandboxInfraError, SandboxResourceError):
            raise   # not an observation: the episode ends ("infra" / "resource"), docs/SPEC.md §4 infra vs policy
        except Exception as e:  # the policy's own failures (missing file, bad command) go back as text
            out, error = f"Error: {name} failed: {type(e).__name__}: {e}", True
        return ToolResult(truncate_text(out, ctx.max_observation_bytes), error=error)

    def execute_all(self, calls: Sequence[tuple[str, dict[str, Any]]], ctx: ToolContext) -> list[ToolResult]:
        """Several calls of one turn (parallel calls, docs/SPEC.md §5), run at the same time, one thread each:
        each call's result or its own error, in order. A sandbox failure of any call is raised once every
        call has finished (no call is left running in a box the episode then gives up)."""
        if len(calls) == 1:
            return [self.execute(calls[0][0], calls[0][1], ctx)]
        with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="tool-call") as pool:
            futures = [pool.submit(self.execute, name, args, ctx) for name, args in calls]
            wait(futures)
        return [f.result() for f in futures]

    def subset(self, names: Sequence[str], strict: bool | None = None) -> ToolRegistry:
        missing = [n for n in names if n not in self.tools]
        if missing:
            raise ValueError(f"unknown tools {missing}; known: {self.names}")
        return ToolRegistry([self.tools[n] for n in names], self.strict if strict is None else strict)
