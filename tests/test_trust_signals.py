"""Recording from a signal handler never hangs the agent, and loses nothing it accepted.

Python runs a signal handler in the main thread between two bytecodes, also while that thread
is inside a record call and holds one of the recorder's locks. A handler that records, flushes
or closes (``on SIGTERM: flush and exit``) called in again and waited for good on a lock its own
thread held. Each case runs in a child process, so a hang is a timeout the test kills, and
reads back the real store and dead letter it wrote.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import orjson
import pytest

#: Seconds a child may take; a hang is caught here (a child that works takes a few).
HANG = 60

_COMMON = f"""
import faulthandler, json, os, signal, sys, time, warnings
from hindsight_loop import Hindsight, HindsightWarning

faulthandler.dump_traceback_later({HANG - 15}, exit=True)  # where it hung, in the report

warnings.simplefilter("ignore", HindsightWarning)
writer, db = sys.argv[1], sys.argv[2]


def inside_the_recorder(frame):
    # The handler interrupted a record call (the worst moment): a frame of the recorder's.
    while frame is not None:
        name = frame.f_code.co_filename
        if "hindsight_loop" in name and name.endswith(("writer.py", "record.py", "ring.py")):
            return True
        frame = frame.f_back
    return False
"""

# The main thread records in a tight loop while a timer's SIGALRM makes the handler record
# (and for ``flush``, flush when it came inside a record call) every few milliseconds. Each
# call that returned is counted (``list.append`` is one C call: a handler cannot split it).
_TIMER = (
    _COMMON
    + """
mode, bound, every = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
hs = Hindsight(db, writer=writer, background=False, triggers=False, queue_bound=bound)
hs.recorder.block_seconds = 0.002  # under overload: a handler's wait is shorter than the timer's
returned = {"main": [], "handler": []}
alarms, flushes, flushing = [], [], []
pad = "x" * 300


def on_alarm(signum, frame):
    alarms.append(1)
    if flushing:  # nothing within a flush of its own: no event of its own to count on
        return
    # ``on SIGUSR1: flush`` (no timeout), at the worst moment: inside a record call.
    if mode == "flush" and inside_the_recorder(frame):
        flushing.append(1)
        flushes.append(hs.flush())
        flushing.clear()
    mine = returned["handler"]
    hs.record({"type": "user_input", "task_id": "handler", "input": {"i": len(mine)}})
    mine.append(1)


signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, every, every)
mine = returned["main"]
end = time.monotonic() + 2.0
while time.monotonic() < end:
    hs.record({"type": "user_input", "task_id": "main", "input": {"i": len(mine), "pad": pad}})
    mine.append(1)
signal.setitimer(signal.ITIMER_REAL, 0, 0)
signal.signal(signal.SIGALRM, signal.SIG_DFL)
flushed = hs.flush(timeout=30)
hs.close()
out = {k: len(v) for k, v in returned.items()}
out.update(flushed=flushed, flushes=len(flushes), stats=hs.stats)
print(json.dumps(out))
"""
)

# ``on SIGTERM: close and exit``, in rounds (a store each): the signal comes while the main
# thread is inside a record call (the timer's handler looks at where it interrupted, and
# signals only there). The handler of the last round exits the process for real, the others
# stop their round the same way (a BaseException out of the interrupted call).
_SIGTERM = (
    _COMMON
    + """
rounds = int(sys.argv[3])


class Stop(BaseException):
    pass


def on_term(signum, frame):
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    hs.close()
    print(json.dumps({"db": current, "returned": len(mine)}), flush=True)
    if last:
        sys.exit(0)
    raise Stop


def on_alarm(signum, frame):
    if inside_the_recorder(frame):
        on_term(signal.SIGTERM, frame)  # as if SIGTERM came now


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGALRM, on_alarm)
pad = "x" * 300
for r in range(rounds):
    current, last = f"{db}.{r}", r == rounds - 1
    hs = Hindsight(current, writer=writer, background=False, triggers=False)
    # The first event starts the writer's threads: an exception raised into
    # ``Thread.start()`` leaves threading's own locks broken (Python's, whoever calls it).
    hs.record({"type": "user_input", "task_id": "main", "input": {"i": -1}})
    mine = [1]
    signal.setitimer(signal.ITIMER_REAL, 0.0007, 0.0007)
    try:
        while True:
            hs.record({"type": "user_input", "task_id": "main", "input": {"i": len(mine), "p": pad}})
            mine.append(1)
    except Stop:
        pass
"""
)


def _run(script: str, *args: object) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=HANG,
        )
    except subprocess.TimeoutExpired as exc:  # killed by run()
        pytest.fail(f"the agent hung: {(exc.stderr or b'')[:3000]!r}")
    assert done.returncode == 0, done.stderr[:3000]
    return done


def _kept(db: Path) -> tuple[Counter[str], Counter[str]]:
    """Events of each task in the store, and in the dead letter (with any id seen twice)."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT event_id, task_id FROM events").fetchall()
    finally:
        con.close()
    dead = Path(f"{db}.deadletter.jsonl")
    lines = [orjson.loads(x) for x in dead.read_bytes().splitlines()] if dead.exists() else []
    ids = [r[0] for r in rows] + [x["event_id"] for x in lines]
    assert len(ids) == len(set(ids)), "an event kept twice"
    return Counter(r[1] for r in rows), Counter(x["task_id"] for x in lines)


@pytest.mark.parametrize("writer", ["process", "thread"])
@pytest.mark.parametrize(
    ("mode", "bound", "every"),
    [
        ("record", 50_000, 2e-3),
        ("flush", 50_000, 2e-3),
        ("record", 300, 5e-3),
        ("flush", 300, 5e-3),
    ],
    ids=["record", "flush", "record-overload", "flush-overload"],
)
def test_a_handler_recording_and_flushing_while_the_agent_records(
    tmp_path: Path, writer: str, mode: str, bound: int, every: float
) -> None:
    """A timer's handler records (and now and then flushes) every 2 ms while the main thread
    records, or every 5 ms under overload (a bound of 300: spills to the dead letter on the
    agent's thread; a handler takes a few ms then, and one interrupted by the next nests
    deeper each time, Hindsight or not): the agent never hangs, and every event whose call
    returned is kept once."""
    db = tmp_path / "s.db"
    out = json.loads(_run(_TIMER, writer, db, mode, bound, every).stdout)
    assert out["handler"] > (200 if mode == "record" else 20) and out["main"] > 1000
    stored, dead = _kept(db)
    assert stored["main"] + dead["main"] == out["main"]
    assert stored["handler"] + dead["handler"] == out["handler"]
    assert out["stats"]["lost"] == 0
    assert out["flushed"] is True
    if mode == "flush":
        assert out["flushes"] >= 3


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_sigterm_handler_that_closes_and_exits_mid_record(tmp_path: Path, writer: str) -> None:
    """``on SIGTERM: hs.close(); sys.exit(0)`` coming while a record call is under way (eight
    times): the process exits, and everything accepted before is stored or dead-lettered, the
    interrupted call's event at most once."""
    rounds = 8
    done = _run(_SIGTERM, writer, tmp_path / "t.db", rounds)
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(reports) == rounds
    for report in reports:
        stored, dead = _kept(Path(report["db"]))
        kept = stored["main"] + dead["main"]
        assert report["returned"] <= kept <= report["returned"] + 1, (report, stored, dead)


# ``on SIGTERM: close`` (and no exit) while the main thread is inside a record call: the close
# is left for later (the interrupted call goes on once the handler returns), and done at the
# exit. A hook registered first runs last at the exit: it says whether the store was closed.
_DEFERRED = (
    _COMMON
    + """
import atexit

atexit.register(lambda: print(json.dumps({"owed": owed, "closed": hs.store._closed}), flush=True))
hs = Hindsight(db, writer=writer, background=False, triggers=False)
hs.record({"type": "user_input", "task_id": "main", "input": {"i": -1}})
owed = []


def on_alarm(signum, frame):
    if not owed and inside_the_recorder(frame):
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        hs.close()
        owed.append(hs.recorder.held_up)


signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.0007, 0.0007)
i = 0
while not owed:
    hs.record({"type": "user_input", "task_id": "main", "input": {"i": i, "p": "x" * 300}})
    i += 1
"""
)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_close_a_handler_left_for_later_closes_the_store_and_blames_no_held_up_call(
    tmp_path: Path, writer: str
) -> None:
    """A handler's close() that came inside a record call is finished at the exit. Nothing is
    held up then: the store stays open only until that close is done, and is closed by it;
    before, a line blamed a writer's call "held up" and the store was never closed."""
    done = _run(_DEFERRED, writer, tmp_path / "d.db")
    assert json.loads(done.stdout.splitlines()[-1]) == {"owed": [True], "closed": True}
    assert "held up" not in done.stderr, done.stderr[:3000]


# The redaction guards compile on first use, under a lock; Hindsight's log filter redacts with
# them. A handler that logs through Hindsight's logger while the main thread is inside that
# first compile (``record._scanner``) called in again for the lock its own thread held. The
# compile is started afresh until the handler has come inside it often enough.
_COMPILE = (
    _COMMON
    + """
import logging
from hindsight_loop import record

log = logging.getLogger("hindsight_loop")
log.addHandler(logging.StreamHandler(sys.stdout))
log.propagate = False
inside, said, busy = [], [], []


def compiling(frame):
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_scanner" or code.co_filename.endswith("redact_scan.py"):
            return True
        frame = frame.f_back
    return False


def on_alarm(signum, frame):
    if busy or not compiling(frame):
        return  # not the handler's own line: only the main thread's compile is asked about
    busy.append(1)
    inside.append(1)
    log.warning("handler: token=sk-live0123456789abcdefABCDEF")
    said.append(1)
    busy.clear()


signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
for _ in range(2000):
    record._SCANNER = False  # compiled afresh (or read from its cache) by the next call
    used = record.guards_in_use()
    if len(inside) >= 20:
        break
signal.setitimer(signal.ITIMER_REAL, 0, 0)
print(json.dumps({"inside": len(inside), "said": len(said), "guards": record.guards_in_use()}))
"""
)


def test_a_handler_logging_while_the_redaction_guards_compile_does_not_hang() -> None:
    """The handler's log line is redacted by the pure-Python guards meanwhile (the same
    result); the compile it interrupted goes on once it returns."""
    done = _run(_COMPILE, "thread", "unused.db")
    lines = done.stdout.splitlines()
    out = json.loads(lines[-1])
    assert out["inside"] >= 20 and out["said"] == out["inside"]
    assert out["guards"] in ("hyperscan", "python")
    logged = [x for x in lines if x.startswith("handler:")]
    assert len(logged) == out["said"]
    assert all("sk-live" not in x and "[REDACTED]" in x for x in logged)


# Another thread is inside the guards' first load (it holds their lock) as the main thread
# forks: the child's copy of the lock stayed held by a thread the child does not have.
_FORK = (
    _COMMON
    + """
import threading
from hindsight_loop import record

held, release = threading.Event(), threading.Event()


def loading():
    with record._SCANNER_LOCK:
        held.set()
        release.wait()


thread = threading.Thread(target=loading)
thread.start()
held.wait()
record._SCANNER = False
pid = os.fork()
if pid == 0:
    print(json.dumps({"child": record.redact_text("token=sk-live0123456789abcdefABCDEF")}))
    sys.stdout.flush()
    os._exit(0)
release.set()
thread.join()
deadline = time.monotonic() + 20
while os.waitpid(pid, os.WNOHANG) == (0, 0):
    if time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print(json.dumps({"child": "hung"}))
        break
    time.sleep(0.01)
"""
)


def test_a_child_forked_while_another_thread_loads_the_guards_redacts() -> None:
    """The child has a lock of its own, and loads the guards itself."""
    done = _run(_FORK, "thread", "unused.db")
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["child"] != "hung"
    assert "sk-live" not in out["child"] and "[REDACTED]" in out["child"]
