"""The built-in tools: read_file, edit_file, run_shell, grep, list_dir, todo_write (docs/SPEC.md §5).

Every tool acts only through the `Sandbox` protocol (`exec` / `read_file` / `write_file`),
so the same code runs against Docker and the local fallback. Semantics follow the
str_replace editor users know (REFERENCES.md "Docker sandboxes"): absolute paths,
`cat -n` numbering, `create` refuses to overwrite, `str_replace` must match exactly once.
Failures raise `ToolArgError`, which the registry turns into observation text; a sandbox that
refuses a file operation (permission, missing file) is such a failure. `SandboxInfraError`
(the sandbox or engine failed) and `SandboxResourceError` (a budget was exceeded) are never
turned into text here: they propagate and end the episode (docs/SPEC.md §4.1 "infrastructure is
not the policy").
"""

from __future__ import annotations

import re
import shlex

from horizon.sandbox.base import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfraError,
    SandboxIsADirectoryError,
    SandboxResourceError,
)
from horizon.tools.registry import Param, Tool, ToolArgError, ToolContext, ToolRegistry

SNIPPET_CONTEXT_LINES = 4
TODO_STATUSES = ("pending", "in_progress", "completed")


def _abs(path: str) -> str:
    if "\x00" in path:
        raise ToolArgError(f"path must not contain a NUL byte, got {path!r:.200}")
    if not path.startswith("/"):
        raise ToolArgError(f"path must be absolute (e.g. /workspace/{path.lstrip('./')}), got {path!r}")
    return path


_PASS_THROUGH = (SandboxInfraError, SandboxResourceError)   # end the episode: never observation text


def _exists(ctx: ToolContext, path: str) -> bool:
    return ctx.sandbox.exec(f"test -e {shlex.quote(path)}", timeout=ctx.timeout_s, workdir="/").exit_code == 0


def _read_text(ctx: ToolContext, path: str) -> str:
    try:
        data = ctx.sandbox.read_file(path)
    except _PASS_THROUGH:
        raise
    except (SandboxIsADirectoryError, IsADirectoryError):
        raise ToolArgError(f"{path} is a directory; use list_dir") from None
    except (SandboxFileNotFoundError, FileNotFoundError):
        raise ToolArgError(f"cannot read {path}: file does not exist") from None
    except (SandboxError, OSError) as e:
        raise ToolArgError(_sandbox_detail(e, "read_file", f"cannot read {path}")) from None
    return data.decode("utf-8", errors="replace")


def _write_text(ctx: ToolContext, path: str, text: str) -> None:
    try:
        ctx.sandbox.write_file(path, text)
    except _PASS_THROUGH:
        raise
    except (SandboxError, OSError) as e:
        raise ToolArgError(_sandbox_detail(e, "write_file", f"cannot write {path}")) from None


def _sandbox_detail(e: Exception, op: str, context: str) -> str:
    """A sandbox file error as the model should read it: "/etc/shadow: Permission denied" (like
    cat's), with `context` in front only when the message does not name the file itself."""
    detail = str(e)
    detail = detail[len(op) + 2:] if detail.startswith(f"{op}: ") else detail
    return detail if re.match(r"/|[\w.-]+: ", detail) else f"{context}: {detail}"


def number_lines(lines: list[str], start: int = 1) -> str:
    """`cat -n` style: right-aligned line number, tab, line."""
    return "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, start))


def read_file(ctx: ToolContext, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
    path = _abs(path)
    lines = _read_text(ctx, path).split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    n = len(lines)
    start = 1 if start_line is None else start_line
    end = n if end_line is None or end_line == -1 else end_line
    if n == 0:
        return f"{path} is empty."
    if not 1 <= start <= n:
        raise ToolArgError(f"start_line {start} is out of range: {path} has {n} lines")
    if end < start:
        raise ToolArgError(f"end_line {end} is before start_line {start}")
    end = min(end, n)
    return number_lines(lines[start - 1:end], start)


def _snippet(text: str, first_line: int, n_new_lines: int) -> str:
    lines = text.split("\n")
    lo = max(1, first_line - SNIPPET_CONTEXT_LINES)
    hi = min(len(lines), first_line + n_new_lines + SNIPPET_CONTEXT_LINES)
    return number_lines(lines[lo - 1:hi], lo)


def edit_file(ctx: ToolContext, command: str, path: str, old_str: str | None = None,
              new_str: str | None = None, file_text: str | None = None,
              insert_line: int | None = None) -> str:
    path = _abs(path)
    if command == "create":
        if file_text is None:
            raise ToolArgError("command 'create' needs parameter 'file_text'")
        if _exists(ctx, path):
            raise ToolArgError(f"File already exists at: {path}. Cannot overwrite files using command "
                               "`create`; use `str_replace`.")
        _write_text(ctx, path, file_text)
        return f"File created successfully at: {path}"
    if command == "str_replace":
        if old_str is None:
            raise ToolArgError("command 'str_replace' needs parameter 'old_str'")
        if old_str == "":
            raise ToolArgError("old_str must not be empty")
        text = _read_text(ctx, path)
        count = text.count(old_str)
        if count == 0:
            raise ToolArgError(f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}.")
        if count > 1:
            starts, i = [], text.find(old_str)
            while i >= 0:
                starts.append(text.count("\n", 0, i) + 1)
                i = text.find(old_str, i + 1)
            raise ToolArgError(f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in "
                               f"lines {starts}. Please ensure it is unique.")
        new = new_str or ""
        at = text.find(old_str)
        out = text[:at] + new + text[at + len(old_str):]
        _write_text(ctx, path, out)
        first = text.count("\n", 0, at) + 1
        return (f"The file {path} has been edited. Here's a snippet of the edited file:\n"
                f"{_snippet(out, first, new.count(chr(10)))}")
    if command == "insert":
        if insert_line is None or new_str is None:
            raise ToolArgError("command 'insert' needs parameters 'insert_line' and 'new_str'")
        text = _read_text(ctx, path)
        lines = text.split("\n")
        trailing_nl = text.endswith("\n")
        if trailing_nl:
            lines = lines[:-1]
        if not 0 <= insert_line <= len(lines):
            raise ToolArgError(f"insert_line {insert_line} is out of range [0, {len(lines)}] for {path}")
        new_lines = new_str.split("\n")
        out_lines = lines[:insert_line] + new_lines + lines[insert_line:]
        out = "\n".join(out_lines) + ("\n" if trailing_nl or not text else "")
        _write_text(ctx, path, out)
        return (f"The file {path} has been edited. Here's a snippet of the edited file:\n"
                f"{_snippet(out, insert_line + 1, len(new_lines) - 1)}")
    raise ToolArgError(f"unknown command {command!r}; use one of ['str_replace', 'create', 'insert']")


def run_shell(ctx: ToolContext, command: str, timeout: int | None = None) -> str:
    t = ctx.timeout_s if timeout is None else float(timeout)
    if t <= 0:
        raise ToolArgError(f"timeout must be positive, got {timeout}")
    t = min(t, ctx.max_timeout_s)
    res = ctx.sandbox.exec(command, timeout=t)
    tail = f"[exit code: {res.exit_code}]"
    if res.timed_out:
        tail = f"[command timed out after {t:g}s; exit code: {res.exit_code}]"
    return f"{res.output.rstrip(chr(10))}\n{tail}" if res.output else tail


def grep(ctx: ToolContext, pattern: str, path: str = "/workspace", include: str | None = None) -> str:
    path = _abs(path)
    inc = f" --include={shlex.quote(include)}" if include else ""
    res = ctx.sandbox.exec(f"grep -rnI -E{inc} -e {shlex.quote(pattern)} -- {shlex.quote(path)}",
                           timeout=ctx.timeout_s, workdir="/")
    if res.exit_code == 1:
        return f"No matches found for pattern {pattern!r} in {path}"
    if res.exit_code != 0:
        raise ToolArgError(f"grep failed (exit code {res.exit_code}): {res.output.strip()}")
    return res.output.rstrip("\n")


def list_dir(ctx: ToolContext, path: str = "/workspace", depth: int = 2) -> str:
    path = _abs(path)
    if depth < 1:
        raise ToolArgError(f"depth must be >= 1, got {depth}")
    q = shlex.quote(path)
    # One exec: exit 3 = not a directory, 4 = the directory itself cannot be listed (an error);
    # unreadable subdirectories only add find's "Permission denied" lines to the listing.
    res = ctx.sandbox.exec(
        f"[ -d {q} ] || exit 3; [ -r {q} ] && [ -x {q} ] || exit 4; "
        f"find {q} -mindepth 1 -maxdepth {int(depth)} -name '.*' -prune -o "
        f"-type d -printf '%p/\\n' -o -printf '%p\\n' | LC_ALL=C sort",
        timeout=ctx.timeout_s, workdir="/")
    if res.exit_code == 3:
        raise ToolArgError(f"{path} is not a directory")
    if res.exit_code == 4:
        raise ToolArgError(f"cannot list {path}: Permission denied")
    if res.exit_code != 0:
        raise ToolArgError(f"list_dir failed: {res.output.strip()}")
    body = res.output.rstrip("\n")
    return f"{path}/ (hidden entries omitted)\n{body}" if body else f"{path}/ is empty"


def todo_write(ctx: ToolContext, todos: list) -> str:
    clean = []
    for i, t in enumerate(todos):
        if not isinstance(t, dict) or not isinstance(t.get("content"), str) or not t["content"].strip():
            raise ToolArgError(f"todos[{i}] must be an object with a non-empty string 'content'")
        status = t.get("status", "pending")
        if status not in TODO_STATUSES:
            raise ToolArgError(f"todos[{i}].status must be one of {list(TODO_STATUSES)}, got {status!r}")
        clean.append({"content": t["content"].strip(), "status": status})
    ctx.state.todos = clean
    for t in clean:
        ctx.state.todo_status[t["content"]] = t["status"]
    mark = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
    lines = [f"{mark[t['status']]} {t['content']}" for t in clean]
    return "Todo list updated:\n" + ("\n".join(lines) if lines else "(empty)")


BUILTIN_TOOLS: dict[str, Tool] = {t.name: t for t in [
    Tool("read_file", "Show a file with line numbers (cat -n), optionally a line range.",
         (Param("path", "str", True, "absolute path"),
          Param("start_line", "int", False, "first line (1-based)"),
          Param("end_line", "int", False, "last line (inclusive; -1 = end of file)")), read_file),
    Tool("edit_file", "Edit a file: str_replace (replace old_str, which must occur exactly once, by new_str), "
         "create (new file with file_text; fails if it exists), insert (new_str after line insert_line; 0 = top).",
         (Param("command", "str", True, "", enum=("str_replace", "create", "insert")),
          Param("path", "str", True, "absolute path"),
          Param("old_str", "str", False, "exact text to replace (str_replace)"),
          Param("new_str", "str", False, "replacement / inserted text"),
          Param("file_text", "str", False, "content of the new file (create)"),
          Param("insert_line", "int", False, "line after which to insert (insert)")), edit_file),
    Tool("run_shell", "Run a bash command in /workspace; shows output and exit code.",
         (Param("command", "str", True, "bash command"),
          Param("timeout", "int", False, "seconds (capped)")), run_shell),
    Tool("grep", "Search file contents recursively (extended regex); prints path:line:text.",
         (Param("pattern", "str", True, "extended regular expression"),
          Param("path", "str", False, "file or directory (default /workspace)"),
          Param("include", "str", False, "only files matching this glob, e.g. *.py")), grep),
    Tool("list_dir", "List a directory tree (directories end with /).",
         (Param("path", "str", False, "absolute path (default /workspace)"),
          Param("depth", "int", False, "levels to show (default 2)")), list_dir),
    Tool("todo_write", "Replace your todo list: a JSON list of {\"content\": str, \"status\": "
         "\"pending\"|\"in_progress\"|\"completed\"}.",
         (Param("todos", "list", True, "JSON list of todo objects"),), todo_write),
]}


def make_registry(names=None, strict: bool = True) -> ToolRegistry:
    """A registry with the named built-in tools (all of them by default)."""
    names = list(BUILTIN_TOOLS) if names is None else list(names)
    missing = [n for n in names if n not in BUILTIN_TOOLS]
    if missing:
        raise ValueError(f"unknown tools {missing}; built-in tools: {list(BUILTIN_TOOLS)}")
    return ToolRegistry([BUILTIN_TOOLS[n] for n in names], strict=strict)


def registry_for(cfg, env: str | None = None) -> ToolRegistry:
    """The tool set and strictness for environment `env` (e.g. a task kind) from `cfg.agent`-style
    config: `cfg.tool_sets[env]` (falls back to `cfg.tool_sets["default"]`) and `cfg.strict_tools`."""
    sets = cfg.tool_sets
    key = env if env is not None and env in sets else "default"
    return make_registry(list(sets[key]), strict=bool(cfg.strict_tools))
