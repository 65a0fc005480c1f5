"""Call format: the parser never raises, render/parse roundtrip, clear errors (docs/SPEC.md §5)."""

import numpy as np
import pytest

from horizon.tools.format import (
    Action,
    ParseError,
    parse_action,
    parse_summary,
    render_call,
    render_final,
    render_summary,
)

FRAGMENTS = ["<function=", "</function>", "<parameter=", "</parameter>", "<think>", "</think>", "<final>",
             "</final>", "<summary>", "</summary>", ">", "<", "=", "read_file", "path", "\n", " ", "x",
             "/workspace/a.py", "\x00", "\ufffd", "é", "{", "[1, 2]", "<function", "<parameter"]


def test_parser_never_raises_on_random_bytes():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        raw = rng.integers(0, 256, size=int(rng.integers(0, 200)), dtype=np.uint8).tobytes()
        for x in (raw, raw.decode("utf-8", errors="replace")):
            r = parse_action(x)
            assert isinstance(r, (Action, ParseError))
            assert isinstance(parse_summary(x), (tuple, ParseError))


def test_parser_never_raises_on_fuzzed_tag_soup():
    rng = np.random.default_rng(1)
    kinds = {"call": 0, "final": 0, "error": 0}
    for _ in range(5000):
        s = "".join(FRAGMENTS[i] for i in rng.integers(0, len(FRAGMENTS), size=int(rng.integers(0, 25))))
        r = parse_action(s)
        assert isinstance(r, (Action, ParseError))
        kinds["error" if isinstance(r, ParseError) else r.kind] += 1
        if isinstance(r, ParseError):
            assert r.observation().startswith("Your action could not be parsed: ")
    assert kinds["error"] > 0


def test_parser_accepts_non_text():
    for x in (None, 3, ["<final>x</final>"], object()):
        assert isinstance(parse_action(x), ParseError)


def _random_value(rng):
    alphabet = list("ab \n\t<>=/{}\"'\\é") + ["</function>", "<parameter=x>", "</final>", "\n\n"]
    return "".join(alphabet[i] for i in rng.integers(0, len(alphabet), size=int(rng.integers(0, 30))))


def test_render_parse_roundtrip_fuzzed():
    rng = np.random.default_rng(2)
    for _ in range(500):
        args = {f"k{j}": _random_value(rng) for j in range(int(rng.integers(0, 4)))}
        think = None if rng.random() < 0.5 else _random_value(rng).replace("</think>", "").replace("<", "(")
        r = parse_action(render_call("some_tool", args, thinking=think))
        assert isinstance(r, Action), (args, r)
        assert (r.kind, r.name, r.args) == ("call", "some_tool", args)
        assert r.thinking == (think or "")


def test_roundtrip_typed_values_are_json():
    r = parse_action(render_call("read_file", {"path": "/w/a", "start_line": 3, "todos": [{"a": 1}]}))
    assert r.args == {"path": "/w/a", "start_line": "3", "todos": '[{"a": 1}]'}


def test_final_and_summary():
    r = parse_action(render_final("the answer is 42", thinking="hmm"))
    assert (r.kind, r.final, r.thinking) == ("final", "the answer is 42", "hmm")
    assert parse_summary(render_summary("S\nT", thinking="x")) == ("x", "S\nT")
    assert parse_summary("<think>a</think> plain summary") == ("a", "plain summary")
    assert isinstance(parse_summary("<think>a</think>   "), ParseError)


@pytest.mark.parametrize("text,needle", [
    ("just chatting", "no tool call and no <final>"),
    ("<function=read_file><parameter=path>/a</parameter>", "never closed with </function>"),
    ("<function=read_file><parameter=path>/a</function>", "never closed with </parameter>"),
    ("<function=1bad></function>", "invalid tool name"),
    ("<function read_file></function>", "write <function=NAME>"),
    ("<function=a></function><function=b></function>", "only one tool call"),
    ("<function=a><parameter=p>1</parameter><parameter=p>2</parameter></function>", "more than once"),
    ("<function=a>junk</function>", "expected <parameter=KEY>"),
    ("<think>unclosed", "<think> was never closed"),
    ("<final>x</final><function=a></function>", "not both"),
    ("<final>x", "never closed with </final>"),
])
def test_parse_errors_are_specific(text, needle):
    r = parse_action(text)
    assert isinstance(r, ParseError) and needle in r.message, r


def test_value_cannot_hold_param_close():
    with pytest.raises(ValueError):
        render_call("a", {"x": "</parameter>"})


def test_multiline_value_and_narration():
    text = "I will edit.\n<function=edit_file>\n<parameter=old_str>\n  a\n  b\n</parameter>\n</function>\n  "
    r = parse_action(text)
    assert r.args == {"old_str": "  a\n  b"}


def test_hermes_format_roundtrips_and_errors_in_one_line():
    """The pluggable format interface's second implementation (JSON calls): parse(render(x)) == x,
    and malformed JSON / names become a ParseError the model sees, never an exception."""
    from horizon.tools.format import HermesFormat, tool_format

    fmt = tool_format("hermes")
    assert isinstance(fmt, HermesFormat)
    args = {"path": "/workspace/a b.py", "old_str": "x\n</parameter>\n", "count": 3, "todos": [{"a": 1}]}
    act = fmt.parse_action(fmt.render_call("edit_file", args, thinking="plan"))
    assert act == Action("call", name="edit_file", args={"path": "/workspace/a b.py", "old_str": "x\n</parameter>\n",
                                                         "count": "3", "todos": '[{"a": 1}]'}, thinking="plan")
    assert fmt.parse_action(fmt.render_final("done")) == Action("final", final="done")
    for bad, why in [('<tool_call>{"name": "read_file", "arguments": {"path": 1</tool_call>', "not valid JSON"),
                     ('<tool_call>{"name": "rm -rf", "arguments": {}}</tool_call>', '{"name": NAME'),
                     ('<tool_call>{"name": "a", "arguments": []}</tool_call>', "must be an object"),
                     ('<tool_call>{"name": "a"}', "unterminated"),
                     ('<tool_call>{"name": "a"}</tool_call> more', "text after")]:
        r = fmt.parse_action(bad)
        assert isinstance(r, ParseError) and why in r.message, (bad, r)
    with pytest.raises(ValueError, match="unknown tool format 'nope'; registered: hermes, horizon"):
        tool_format("nope")
