"""horizon.tools: the agent's tools, their call format and registry (docs/SPEC.md §5).

Tool names and arguments (what scripted solutions in `Task.solution` use):

- `read_file`  {"path": abs path, "start_line": int?, "end_line": int? (-1 = EOF)} -> `cat -n` text
- `edit_file`  {"command": "str_replace", "path", "old_str", "new_str"}  (old_str must occur exactly once)
               {"command": "create", "path", "file_text"}                 (fails if the file exists)
               {"command": "insert", "path", "insert_line": int, "new_str"} (after line N; 0 = top)
- `run_shell`  {"command": str, "timeout": int? seconds}  -> output + "[exit code: N]"
- `grep`       {"pattern": extended regex, "path": str? (default /workspace), "include": glob?}
- `list_dir`   {"path": str? (default /workspace), "depth": int? (default 2)}
- `todo_write` {"todos": [{"content": str, "status": "pending"|"in_progress"|"completed"}]}

Call text (see `horizon.tools.format`): `<function=NAME><parameter=KEY>VALUE</parameter></function>`.
"""

from horizon.tools.builtin import BUILTIN_TOOLS, make_registry, registry_for
from horizon.tools.format import (
    Action,
    ParseError,
    parse_action,
    parse_summary,
    render_call,
    render_final,
    render_summary,
)
from horizon.tools.registry import Param, Tool, ToolContext, ToolRegistry, ToolResult, ToolState, truncate_text

__all__ = ["BUILTIN_TOOLS", "make_registry", "registry_for", "Action", "ParseError", "parse_action",
           "parse_summary", "render_call", "render_final", "render_summary", "Param", "Tool", "ToolContext",
           "ToolRegistry", "ToolResult", "ToolState", "truncate_text"]
