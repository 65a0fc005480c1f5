"""The pytest plugin the task generator copies into its containers (`horizon.taskgen.coverage`).

Loaded there as ``-p horizon_gen_plugin`` (this file, renamed); never imported by horizon itself.
Two jobs, each switched on by an environment variable naming a file:

- ``HORIZON_COVERAGE_OUT``: per test (setup, call, teardown), the code objects under /workspace it
  ran (a ``sys.settrace`` call hook that records the frame's code and never traces lines), written
  as {test id: ["path:first line", ...]};
- ``HORIZON_SELECT``: run only the test ids listed there (one a line).
"""

import json
import os
import sys
import threading

import pytest

_OUT = os.environ.get("HORIZON_COVERAGE_OUT")
_SEL = os.environ.get("HORIZON_SELECT")
_ROOT = "/workspace/"
_calls, _cur = {}, [None]


def _tracer(frame, event, arg):
    if _cur[0] is not None:
        _cur[0].add(frame.f_code)


def pytest_collection_modifyitems(session, config, items):
    if _SEL:
        with open(_SEL) as f:
            keep = set(f.read().split("\n"))
        sel = [i for i in items if i.nodeid in keep]
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in keep])
        items[:] = sel


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _OUT:
        yield
        return
    _cur[0] = set()
    sys.settrace(_tracer)
    threading.settrace(_tracer)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)
        _calls[item.nodeid] = _cur[0]
        _cur[0] = None


def pytest_sessionfinish(session):
    if _OUT:
        cov = {n: sorted({f"{c.co_filename[len(_ROOT):]}:{c.co_firstlineno}" for c in codes
                          if c.co_filename.startswith(_ROOT)}) for n, codes in _calls.items()}
        with open(_OUT, "w") as f:
            json.dump(cov, f)
