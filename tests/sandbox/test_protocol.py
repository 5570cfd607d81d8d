"""The worker protocol (kernellab/sandbox/_protocol.py): every message one side sends is one the other side
handles, and no side sends or matches a bare string. Read off the code itself (its sends and its comparisons
of a message's first item), so a message added on one side only, or added as a bare string, fails here."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

from kernellab.sandbox._protocol import TO_EXECUTOR, TO_WORKER, Msg

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
