"""Procedural bug injection into Python source: the generator's mutations (SPEC §7 tasks; issue 26).

`candidates(source)` lists every mutation the AST offers, in a fixed order; `mutate(source, seed)`
picks one deterministically (a kind first, uniformly among those the file offers, then a site), and
`sample(source, n, seed)` picks up to n distinct ones. Each `Mutation` carries the mutated source,
its kind, its location (line, column, enclosing function) and two unified diffs in git's format:
`bug_patch` (original -> mutated) and `gold_patch`, the inverse (mutated -> original), which
``git apply`` takes in the mutated repository.

Edits are made in the source text at the AST node's position (the operator token, the constant,
the argument spans, the statement's lines), so a mutation's diff is one small hunk and comments
and formatting elsewhere are untouched. A candidate whose result does not compile or equals the
original is dropped. Kinds (`KINDS`):

    operator_swap     a + b -> a - b, * <-> /, // -> /, % -> //, ** -> *, & <-> |, << <-> >>, += -> -=
    comparison_swap   < <-> <=, > <-> >=, == <-> !=, in <-> not in, is <-> is not
    boolean_swap      and <-> or
    off_by_one        an int in a subscript, a range()/enumerate() argument or a +/- operand, +-1
    change_constant   another number (n -> n*2 or 0 <-> 1, x.y -> 2*x.y), True <-> False
    invert_condition  if/while/ternary test c -> not (c) (or `not c` -> c)
    swap_arguments    two adjacent positional arguments of a call swapped
    remove_return     a `return` statement deleted (`pass` if it was the block's only statement)
    remove_branch     an `if` without else deleted (a guard clause)
    remove_statement  an expression statement (a bare call: lst.append(x)) deleted
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import random
import re

KINDS = ("operator_swap", "comparison_swap", "boolean_swap", "off_by_one", "change_constant", "invert_condition",
         "swap_arguments", "remove_return", "remove_branch", "remove_statement")

_BINOP_SWAP = {ast.Add: (ast.Sub, "+", "-"), ast.Sub: (ast.Add, "-", "+"), ast.Mult: (ast.Div, "*", "/"),
               ast.Div: (ast.Mult, "/", "*"), ast.FloorDiv: (ast.Div, "//", "/"), ast.Mod: (ast.FloorDiv, "%", "//"),
               ast.Pow: (ast.Mult, "**", "*"), ast.BitAnd: (ast.BitOr, "&", "|"), ast.BitOr: (ast.BitAnd, "|", "&"),
               ast.LShift: (ast.RShift, "<<", ">>"), ast.RShift: (ast.LShift, ">>", "<<")}
_CMP_SWAP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
             ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
             ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
_BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_OFF_BY_ONE_CALLS = ("range", "enumerate")


class MutationError(ValueError):
    """The source cannot be mutated (does not parse, or offers no mutation of the asked kinds)."""


@dataclasses.dataclass(frozen=True)
class Mutation:
    kind: str             # one of KINDS
    path: str             # the file's path in its repository (the diffs' a/ b/ names)
    line: int             # 1-based line of the mutated node
    col: int              # 0-based column (characters)
    function: str         # enclosing function's qualified name ("" at module level)
    description: str      # e.g. "'<' -> '<='"
    original: str
    source: str           # the mutated source
    bug_patch: str        # unified diff original -> mutated
    gold_patch: str       # unified diff mutated -> original (the fix)

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.col}" + (f" in {self.function}" if self.function else "")


@dataclasses.dataclass(frozen=True)
class _Edit:
    """Replace byte spans of the source: ((line, col_byte, end_line, end_col_byte), text), non-overlapping."""
    kind: str
    line: int
    col: int
    description: str
    spans: tuple


def _offsets(source: str) -> list[int]:
    """Byte offset of the start of each 1-based line of the UTF-8 encoded source (index 0 unused)."""
    out, pos = [0, 0], 0
    for ln in source.encode("utf-8").splitlines(keepends=True):
        pos += len(ln)
        out.append(pos)
    return out


def _span(node) -> tuple[int, int, int, int]:
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset


def _apply(source: str, spans) -> str:
    data, offs = source.encode("utf-8"), _offsets(source)
    for (l0, c0, l1, c1), text in sorted(spans, key=lambda s: (s[0][0], s[0][1]), reverse=True):
        a, b = offs[l0] + c0, offs[l1] + c1
        data = data[:a] + text.encode("utf-8") + data[b:]
    return data.decode("utf-8")


def _text(source_b: bytes, offs, l0, c0, l1, c1) -> str:
    return source_b[offs[l0] + c0:offs[l1] + c1].decode("utf-8")


def _token_between(source_b, offs, left, right, old: str, new: str):
    """The span of operator `old` between nodes `left` and `right` (for a precise token swap)."""
    seg = _text(source_b, offs, left.end_lineno, left.end_col_offset, right.lineno, right.col_offset)
    words = old.split()
    pat = r"\s+".join(re.escape(w) for w in words)
    if old[0].isalpha():
        pat = rf"(?<![\w]){pat}(?![\w])"
    else:
        pat = rf"(?<![*/<>=!&|%]){pat}(?![*/<>=&|])"
    m = re.search(pat, seg)
    if m is None or "#" in seg[:m.start()]:
        return None
    start = offs[left.end_lineno] + left.end_col_offset + m.start()
    return _from_abs(offs, start), _from_abs(offs, start + len(m.group(0).encode("utf-8"))), new


def _from_abs(offs, pos):
    line = max(i for i in range(1, len(offs)) if offs[i] <= pos)
    return line, pos - offs[line]


def _tok_edit(kind, node, tok, desc):
    if tok is None:
        return None
    (l0, c0), (l1, c1), new = tok
    return _Edit(kind, node.lineno, node.col_offset, desc, (((l0, c0, l1, c1), new),))


def _number_variants(value):
    if isinstance(value, bool):
        return [("change_constant", not value)]
    if isinstance(value, int):
        return [("change_constant", 1 - value if value in (0, 1) else value * 2)]
    if isinstance(value, float):
        return [("change_constant", value * 2 if value else 1.0)]
    return []


def _is_docstring(node, parents) -> bool:
    p = parents.get(node)
    return (isinstance(p, ast.Expr) and isinstance(parents.get(p), (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.ClassDef)) and parents[p].body[0] is p)


def _off_by_one_context(node, parents) -> bool:
    p = parents.get(node)
    if isinstance(p, ast.UnaryOp):
        p = parents.get(p)
    if isinstance(p, (ast.Subscript, ast.Slice)):
        return True
    if isinstance(p, ast.BinOp) and isinstance(p.op, (ast.Add, ast.Sub)):
        return True
    return isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id in _OFF_BY_ONE_CALLS


def _whole_lines(stmt, lines, siblings) -> bool:
    """`stmt` alone on its lines: nothing before it on its first line, no sibling on its last."""
    if lines[stmt.lineno - 1][:stmt.col_offset].strip():
        return False
    return all(s is stmt or s.lineno > stmt.end_lineno or s.end_lineno < stmt.lineno for s in siblings)


def _remove_stmt(kind, stmt, parent_body, lines, desc):
    if not _whole_lines(stmt, lines, parent_body):
        return None
    last = lines[stmt.end_lineno - 1]
    if last.rstrip().endswith(";") or stmt.end_col_offset < len(last.rstrip().encode("utf-8")):
        return None
    start = (stmt.lineno, 0, stmt.end_lineno, len(last.encode("utf-8")))
    text = " " * stmt.col_offset + "pass" if len(parent_body) == 1 else None
    if text is None:   # delete the lines, newline included
        start = (stmt.lineno, 0, stmt.end_lineno + 1, 0)
        text = ""
    return _Edit(kind, stmt.lineno, stmt.col_offset, desc, ((start, text),))


def _edits(source: str, tree) -> list[_Edit]:
    src_b, offs = source.encode("utf-8"), _offsets(source)
    lines = source.split("\n")
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    # positions inside f-strings are unreliable before Python 3.12: leave them alone
    in_fstring = {n for j in ast.walk(tree) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}
    out = []
    for node in ast.walk(tree):
        if node in in_fstring:
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
            _, old, new = _BINOP_SWAP[type(node.op)]
            out.append(_tok_edit("operator_swap", node, _token_between(src_b, offs, node.left, node.right, old, new),
                                 f"{old!r} -> {new!r}"))
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP:
            _, old, new = _BINOP_SWAP[type(node.op)]
            out.append(_tok_edit("operator_swap", node, _token_between(src_b, offs, node.target, node.value,
                                                                       old + "=", new + "="), f"{old}= -> {new}="))
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                old, new = _CMP_SWAP[type(op)]
                left = node.left if i == 0 else node.comparators[i - 1]
                out.append(_tok_edit("comparison_swap", node,
                                     _token_between(src_b, offs, left, node.comparators[i], old, new),
                                     f"{old!r} -> {new!r}"))
        elif isinstance(node, ast.BoolOp):
            old, new = _BOOL_SWAP[type(node.op)]
            for a, b in zip(node.values, node.values[1:]):
                out.append(_tok_edit("boolean_swap", node, _token_between(src_b, offs, a, b, old, new),
                                     f"{old!r} -> {new!r}"))
        elif isinstance(node, ast.Constant) and not _is_docstring(node, parents):
            v = node.value
            if isinstance(v, int) and not isinstance(v, bool) and _off_by_one_context(node, parents):
                for d in (1, -1):
                    if v + d >= 0:
                        out.append(_Edit("off_by_one", node.lineno, node.col_offset, f"{v} -> {v + d}",
                                         ((_span(node), repr(v + d)),)))
            else:
                for kind, nv in _number_variants(v):
                    out.append(_Edit(kind, node.lineno, node.col_offset, f"{v!r} -> {nv!r}",
                                     ((_span(node), repr(nv)),)))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            t = node.test
            inner = t.operand if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) else None
            new = _text(src_b, offs, *_span(inner)) if inner is not None else f"not ({_text(src_b, offs, *_span(t))})"
            out.append(_Edit("invert_condition", t.lineno, t.col_offset, f"condition -> {new!r}", ((_span(t), new),)))
        elif isinstance(node, ast.Call):
            args = node.args
            for a, b in zip(args, args[1:]):
                if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
                    continue
                ta, tb = _text(src_b, offs, *_span(a)), _text(src_b, offs, *_span(b))
                if ta != tb:
                    out.append(_Edit("swap_arguments", a.lineno, a.col_offset, f"({ta}, {tb}) -> ({tb}, {ta})",
                                     ((_span(a), tb), (_span(b), ta))))
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for stmt in body:
                if isinstance(stmt, ast.Return):
                    out.append(_remove_stmt("remove_return", stmt, body, lines, "return removed"))
                elif isinstance(stmt, ast.If) and not stmt.orelse:
                    out.append(_remove_stmt("remove_branch", stmt, body, lines, "if-branch removed"))
                elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                    out.append(_remove_stmt("remove_statement", stmt, body, lines, "call statement removed"))
    return [e for e in out if e is not None]


def _functions(tree) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function, outermost first."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((child.lineno, child.end_lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(tree, "")
    return out


def _char_col(source: str, line: int, col_b: int) -> int:
    return len(source.split("\n")[line - 1].encode("utf-8")[:col_b].decode("utf-8", errors="ignore"))


def unified_diff(before: str, after: str, path: str) -> str:
    """A git-format unified diff of one file (``git apply`` reads it); "" if equal."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    body = list(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3))
    if not body:
        return ""
    fixed = [ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in body]
    return f"diff --git a/{path} b/{path}\n" + "".join(fixed)


def candidates(source: str, path: str = "module.py", kinds=None) -> list[Mutation]:
    """Every valid mutation of `source` (compiles, differs), sorted by (line, col, kind, description)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise MutationError(f"{path}: does not parse ({e.msg}, line {e.lineno})") from e
    kinds = tuple(kinds) if kinds is not None else KINDS
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise MutationError(f"unknown mutation kind(s) {unknown}; known: {KINDS}")
    funcs = _functions(tree)
    seen, out = set(), []
    for e in sorted(_edits(source, tree), key=lambda e: (e.line, e.col, e.kind, e.description)):
        if e.kind not in kinds:
            continue
        new = _apply(source, e.spans)
        if new == source or new in seen:
            continue
        try:
            compile(new, path, "exec")
        except SyntaxError:
            continue
        seen.add(new)
        fn = [name for lo, hi, name in funcs if lo <= e.line <= hi]
        out.append(Mutation(e.kind, path, e.line, _char_col(source, e.line, e.col), fn[-1] if fn else "",
                            e.description, source, new, unified_diff(source, new, path),
                            unified_diff(new, source, path)))
    return out


def sample(source: str, n: int, seed: int, path: str = "module.py", kinds=None) -> list[Mutation]:
    """Up to `n` distinct mutations, deterministic in `seed`: round-robin over the kinds the file
    offers (in a seeded order), a seeded site within each kind."""
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutation]] = {}
    for m in candidates(source, path, kinds):
        by_kind.setdefault(m.kind, []).append(m)
    for ms in by_kind.values():
        rng.shuffle(ms)
    order = sorted(by_kind)
    rng.shuffle(order)
    out = []
    while len(out) < n and any(by_kind.values()):
        for k in order:
            if by_kind[k] and len(out) < n:
                out.append(by_kind[k].pop())
    return out


def mutate(source: str, seed: int, path: str = "module.py", kinds=None) -> Mutation:
    """One mutation of `source`, deterministic in `seed`; `MutationError` if none is possible."""
    got = sample(source, 1, seed, path, kinds)
    if not got:
        raise MutationError(f"{path}: no mutation of kind(s) {tuple(kinds) if kinds else KINDS} applies")
    return got[0]
