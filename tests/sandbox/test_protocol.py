"""The worker protocol (kernellab/sandbox/_protocol.py): every message one side sends is one the other side
handles, and no side sends or matches a bare string; no phase is a bare string, and every phase the worker
announces has a limit. Read off the code itself (its sends, its phases and its comparisons of a message's first
item), so a message added on one side only, or a message or phase added as a bare string, fails here."""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
from pathlib import Path

from kernellab.sandbox._api import Limits
from kernellab.sandbox._protocol import ANNOUNCED, TO_EXECUTOR, TO_WORKER, Msg, Phase

SANDBOX = Path(__file__).resolve().parents[2] / "kernellab" / "sandbox"
# the worker process's side (the worker and the job it runs) and the executor's (the slot that owns a worker)
WORKER_SIDE = ("_worker.py", "_job.py", "_reference.py", "_trials.py", "_measure.py", "_timing.py")
EXECUTOR_SIDE = ("_slots.py", "_jobloop.py", "_admission.py", "_executor.py")
# the executor takes READY as a started worker and any other first message as a failed start: FAILED among them
STARTUP_FAILURES = {Msg.FAILED}


def _msg(node: ast.AST) -> Msg | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Msg":
        return Msg[node.attr]
    return None


def _scan(files: tuple[str, ...], root: Path = SANDBOX) -> tuple[set[Msg], set[Msg], list[str]]:
    """(messages sent, messages matched, bare strings sent or matched) in ``files``."""
    sent: set[Msg] = set()
    handled: set[Msg] = set()
    bare: list[str] = []
    for name in files:
        tree = ast.parse((root / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "send" \
                    and node.args:
                first = node.args[0]
                if isinstance(first, ast.Tuple) and first.elts:
                    first = first.elts[0]
                if _msg(first) is not None:
                    sent.add(_msg(first))
                elif isinstance(first, ast.Constant) and isinstance(first.value, str):
                    bare.append(f"{name}:{node.lineno}: sends {first.value!r}")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                found = [m for m in map(_msg, sides) if m is not None]
                handled.update(found)
                first_item = any(isinstance(s, ast.Subscript) and isinstance(s.value, ast.Name) and s.value.id == "msg"
                                 for s in sides)
                if first_item and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                    bare.append(f"{name}:{node.lineno}: matches a message against a bare string")
    return sent, handled, bare


def test_every_message_the_worker_sends_the_executor_handles_and_back():
    w_sent, w_handled, w_bare = _scan(WORKER_SIDE)
    e_sent, e_handled, e_bare = _scan(EXECUTOR_SIDE)
    assert not w_bare + e_bare, "bare strings in the worker protocol (use kernellab.sandbox._protocol.Msg):\n" + \
        "\n".join(w_bare + e_bare)
    if Msg.READY in e_handled:
        e_handled |= STARTUP_FAILURES
    assert w_sent <= e_handled, f"sent by the worker, handled by no executor code: {sorted(w_sent - e_handled)}"
    assert e_sent <= w_handled, f"sent by the executor, handled by no worker code: {sorted(e_sent - w_handled)}"
    # the protocol module's lists are what the code does, and every message is sent by someone
    assert w_sent == TO_EXECUTOR and e_sent == TO_WORKER, (sorted(w_sent), sorted(e_sent))
    assert w_sent | e_sent == set(Msg)


def test_the_scan_sees_a_bare_message_and_an_unhandled_one(tmp_path):
    """The check above is not vacuous: a bare string sent, or a message no one matches, is found."""
    (tmp_path / "w.py").write_text('def f(self):\n    self.send("newthing", 1)\n    self.send(Msg.PEAK, 2)\n')
    (tmp_path / "e.py").write_text('def g(msg):\n    if msg[0] == "peak":\n        pass\n')
    sent, _, bare = _scan(("w.py",), tmp_path)
    _, handled, e_bare = _scan(("e.py",), tmp_path)
    assert sent == {Msg.PEAK} and len(bare) == 1 and "newthing" in bare[0]
    assert handled == set() and len(e_bare) == 1


def test_a_message_is_its_bare_name_pickled_and_printed():
    m = pickle.loads(pickle.dumps((Msg.GO,)))
    assert m == ("go",) and m[0] is Msg.GO
    assert f"{Msg.RESULT}" == str(Msg.RESULT) == "result"
    assert {m.value for m in Msg} == {"job", "go", "exit", "ready", "failed", "phase", "read", "unread", "lock",
                                      "unlock", "regrant", "peak", "reference", "result"}


# calls whose first argument is a phase or a Board label: ``w.phase(..)``, ``spans.switch(..)``, ``_Spans(..)``,
# ``limits.of(..)``, ``board.set(..)``, ``gate._say(..)``
PHASE_CALLS = {"phase", "switch", "of", "_say", "_Spans"}


def _phase(node: ast.AST) -> Phase | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Phase":
        return Phase[node.attr]
    return None


def _scan_phases(files: list[Path]) -> tuple[set[Phase], set[Phase], list[str]]:
    """(phases the worker announces with ``.phase(..)``, phases limited with ``.of(..)``, bare strings passed as
    a phase or label or compared with a variable ``phase``) in ``files``."""
    announced: set[Phase] = set()
    limited: set[Phase] = set()
    bare: list[str] = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args:
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                board = isinstance(f, ast.Attribute) and f.attr == "set" and (
                    isinstance(f.value, ast.Attribute) and f.value.attr.endswith("board")
                    or isinstance(f.value, ast.Name) and f.value.id.endswith("board"))
                if name not in PHASE_CALLS and not board:
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    bare.append(f"{path.name}:{node.lineno}: {name}({first.value!r})")
                elif _phase(first) is not None and name == "phase":
                    announced.add(_phase(first))
                elif _phase(first) is not None and name == "of":
                    limited.add(_phase(first))
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Name) and s.id == "phase" for s in sides) and \
                        any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                    bare.append(f"{path.name}:{node.lineno}: compares a phase with a bare string")
    return announced, limited, bare


def test_no_phase_is_a_bare_string_and_every_announced_phase_has_a_limit():
    announced, limited, bare = _scan_phases(sorted(SANDBOX.glob("*.py")))
    assert not bare, "bare strings as phases (use kernellab.sandbox._protocol.Phase):\n" + "\n".join(bare)
    # what the code announces is the protocol module's list; the executor limits nothing else
    assert announced == ANNOUNCED, sorted(announced ^ ANNOUNCED)
    assert limited <= ANNOUNCED, sorted(limited - ANNOUNCED)
    # a limit chosen for each: a field of Limits of its name, or one named in Limits.SHARED (a new phase would
    # otherwise fall back to the check limit unnoticed)
    fields = {f.name for f in dataclasses.fields(Limits)}
    unlimited = [p for p in ANNOUNCED if p.value not in fields and p not in Limits.SHARED]
    assert not unlimited, f"phases with no limit of their own nor in Limits.SHARED: {sorted(unlimited)}"
    assert set(Limits.SHARED.values()) <= fields
    limits = Limits(**{f: float(i + 1) for i, f in enumerate(sorted(fields))})
    for p in ANNOUNCED:
        assert limits.of(p) == getattr(limits, Limits.SHARED.get(p, p.value)) == limits.of(p.value)


def test_the_phase_scan_sees_a_bare_phase(tmp_path):
    """The check above is not vacuous: a bare phase, label, limit or comparison is found."""
    (tmp_path / "w.py").write_text('def f(w, spans, limits, phase, self):\n    w.phase("load")\n'
                                   '    w.phase(Phase.CHECK)\n    spans.switch("wait_read")\n'
                                   '    limits.of("timing")\n    self.board.set("free")\n    self.board.set(None)\n'
                                   '    _Spans("load")\n    if phase == "compile":\n        pass\n')
    announced, limited, bare = _scan_phases([tmp_path / "w.py"])
    assert announced == {Phase.CHECK} and limited == set() and len(bare) == 6


def test_a_phase_is_its_bare_name_where_it_is_stored():
    assert f"timeout:{Phase.COMPILE}" == "timeout:compile" and f"{Phase.EXCLUSIVE_WAIT}" == "exclusive:wait"
    assert type(str(Phase.LOAD)) is str and Phase.KERNEL_SHARE == "kernel_share"
    assert json.dumps({Phase.TIMING: 1.0, "x": Phase.WAIT_READ}) == '{"timing": 1.0, "x": "wait_read"}'
    assert pickle.loads(pickle.dumps(Phase.FOLLOW)) is Phase.FOLLOW
    # the names stored in results and read by the busy summaries: a rename changes what they hold
    assert {p.value for p in Phase} == {
        "reference", "baseline", "load", "compile", "check", "timing", "follow", "kernel_share", "wait_read",
        "wait_timing_lock", "after_timing", "end", "worker_start", "free", "finish", "probe_wait", "admission",
        "exclusive:wait", "exclusive", "profile:admission", "profile:host", "profile:wait_read", "profile:shared",
        "profile:wait_alone", "profile:alone"}


def test_spans_and_board_give_plain_strings():
    from kernellab.sandbox._gpu import Board
    from kernellab.sandbox._jobloop import _Spans

    board = Board()
    spans = _Spans(Phase.LOAD, board)
    spans.switch(Phase.COMPILE)
    assert all(type(k) is str for k in board.counts()) and board.counts() == {"compile": 1}
    s = spans.done()
    assert set(s) <= {"load", "compile"} and all(type(k) is str for k in s)
