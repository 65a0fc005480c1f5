"""Procedural bug injection into Python source: the generator's mutations (docs/SPEC.md §7).

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

Two more kinds are built from these or from a function, not sampled by `sample` (`EXTRA_KINDS`):

    delete_feature    `feature_deletions`: a function's body (its docstring kept) replaced by
                      ``raise NotImplementedError``: the function is asked back
    combined          `combine`: several mutations of one module applied together (their edits
                      on disjoint, non-adjacent lines); the gold patch reverts all of them
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import random
import re

KINDS = ("operator_swap", "comparison_swap", "boolean_swap", "off_by_one", "change_constant", "invert_condition",
         "swap_arguments", "remove_return", "remove_branch", "remove_statement")

FEATURE_KIND = "delete_feature"
COMBINED_KIND = "combined"
EXTRA_KINDS = (FEATURE_KIND, COMBINED_KIND)

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


def _prepare(source: str, path: str, kinds):
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise MutationError(f"{path}: does not parse ({e.msg}, line {e.lineno})") from e
    kinds = tuple(kinds) if kinds is not None else KINDS
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise MutationError(f"unknown mutation kind(s) {unknown}; known: {KINDS}")
    edits = [e for e in sorted(_edits(source, tree), key=lambda e: (e.line, e.col, e.kind, e.description))
             if e.kind in kinds]
    return tree, edits


def _materialize(source: str, e: _Edit, funcs, path: str, seen: set) -> Mutation | None:
    """The `Mutation` of edit `e` (None if it does not compile, changes nothing or repeats `seen`)."""
    new = _apply(source, e.spans)
    if new == source or new in seen:
        return None
    try:
        compile(new, path, "exec")
    except SyntaxError:
        return None
    seen.add(new)
    fn = [name for lo, hi, name in funcs if lo <= e.line <= hi]
    return Mutation(e.kind, path, e.line, _char_col(source, e.line, e.col), fn[-1] if fn else "",
                    e.description, source, new, unified_diff(source, new, path), unified_diff(new, source, path))


def candidates(source: str, path: str = "module.py", kinds=None) -> list[Mutation]:
    """Every valid mutation of `source` (compiles, differs), sorted by (line, col, kind, description)."""
    tree, edits = _prepare(source, path, kinds)
    funcs, seen = _functions(tree), set()
    return [m for m in (_materialize(source, e, funcs, path, seen) for e in edits) if m is not None]


def sample(source: str, n: int, seed: int, path: str = "module.py", kinds=None) -> list[Mutation]:
    """Up to `n` distinct mutations, deterministic in `seed`: round-robin over the kinds the file
    offers (in a seeded order), a seeded site within each kind. Only the picked sites are applied,
    compiled and diffed (a large module offers thousands; `candidates` makes them all)."""
    rng = random.Random(seed)
    tree, edits = _prepare(source, path, kinds)
    by_kind: dict[str, list[_Edit]] = {}
    for e in edits:
        by_kind.setdefault(e.kind, []).append(e)
    for es in by_kind.values():
        rng.shuffle(es)
    order = sorted(by_kind)
    rng.shuffle(order)
    funcs, seen, out = _functions(tree), set(), []
    while len(out) < n and any(by_kind.values()):
        for k in order:
            while by_kind[k] and len(out) < n:
                m = _materialize(source, by_kind[k].pop(), funcs, path, seen)
                if m is not None:
                    out.append(m)
                    break
    return out


def mutate(source: str, seed: int, path: str = "module.py", kinds=None) -> Mutation:
    """One mutation of `source`, deterministic in `seed`; `MutationError` if none is possible."""
    got = sample(source, 1, seed, path, kinds)
    if not got:
        raise MutationError(f"{path}: no mutation of kind(s) {tuple(kinds) if kinds else KINDS} applies")
    return got[0]


def function_key(source: str, line: int) -> tuple[str, int] | None:
    """(qualified name, first line of its code object: the first decorator's or the ``def`` line) of
    the innermost function containing `line`, or None at module / class-body level (code that runs
    at import). The generator's coverage map keys functions by that first line."""
    tree = ast.parse(source)
    best = None

    def visit(node, prefix):
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                    if child.lineno <= line <= child.end_lineno:
                        best = (name, first)
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(tree, "")
    return best


def feature_deletions(source: str, path: str = "module.py", min_body_lines: int = 2) -> list[Mutation]:
    """One `FEATURE_KIND` mutation per function whose body (docstring aside) spans at least
    `min_body_lines` lines and starts on its own line: the body becomes ``raise NotImplementedError``
    (the docstring stays, so the function's contract is still written down). Sorted by line."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise MutationError(f"{path}: does not parse ({e.msg}, line {e.lineno})") from e
    lines = source.split("\n")
    offs = _offsets(source)
    out = []
    for lo, hi, name in _functions(tree):
        fn = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.lineno <= lo and n.end_lineno == hi and (n.name == name.rsplit(".", 1)[-1]))
        body = list(fn.body)
        doc = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str) else None
        rest = body[1:] if doc is not None else body
        if not rest:
            continue
        first, last = rest[0], rest[-1]
        if last.end_lineno - first.lineno + 1 < min_body_lines or lines[first.lineno - 1][:first.col_offset].strip():
            continue
        if doc is not None and doc.end_lineno >= first.lineno:
            continue
        if lines[last.end_lineno - 1][last.end_col_offset:].strip() not in ("",) and \
                not lines[last.end_lineno - 1][last.end_col_offset:].strip().startswith("#"):
            continue
        indent = " " * first.col_offset
        a = offs[first.lineno]
        b = offs[last.end_lineno] + len(lines[last.end_lineno - 1].encode("utf-8"))
        data = source.encode("utf-8")
        new = (data[:a] + f"{indent}raise NotImplementedError".encode() + data[b:]).decode("utf-8")
        try:
            compile(new, path, "exec")
        except SyntaxError:
            continue
        if new == source:
            continue
        out.append(Mutation(FEATURE_KIND, path, fn.lineno, fn.col_offset, name,
                            f"body of {name} replaced by raise NotImplementedError", source, new,
                            unified_diff(source, new, path), unified_diff(new, source, path)))
    return sorted(out, key=lambda m: m.line)


def changed_lines(m: Mutation) -> list[tuple[int, int, list[str]]]:
    """(first, end) 0-based line ranges of `m.original` that `m` replaces, with the new lines."""
    a, b = m.original.splitlines(keepends=True), m.source.splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return [(i1, i2, b[j1:j2]) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def combine(mutations, path: str | None = None) -> Mutation:
    """The `COMBINED_KIND` mutation applying every one of `mutations` (same file and original; their
    changed lines disjoint and at least one line apart). `MutationError` if they collide."""
    ms = list(mutations)
    if len(ms) < 2:
        raise MutationError("combine needs at least two mutations")
    orig, mpath = ms[0].original, path or ms[0].path
    if any(m.original != orig or m.path != ms[0].path for m in ms):
        raise MutationError("combined mutations must be of the same file and original source")
    edits = sorted((e for m in ms for e in changed_lines(m)), key=lambda e: e[0])
    for (_a1, a2, _), (b1, _b2, _) in zip(edits, edits[1:]):
        if b1 <= a2:      # overlapping or adjacent: the hunks would interact
            raise MutationError(f"{mpath}: mutations touch overlapping or adjacent lines")
    lines = orig.splitlines(keepends=True)
    for i1, i2, new in reversed(edits):
        lines[i1:i2] = new
    new = "".join(lines)
    try:
        compile(new, mpath, "exec")
    except SyntaxError as e:
        raise MutationError(f"{mpath}: the combination does not compile ({e.msg})") from e
    first = min(ms, key=lambda m: m.line)
    return Mutation(COMBINED_KIND, mpath, first.line, first.col, " + ".join(dict.fromkeys(m.function for m in ms)),
                    " + ".join(f"{m.kind} {m.description} (line {m.line})" for m in ms), orig, new,
                    unified_diff(orig, new, mpath), unified_diff(new, orig, mpath))
