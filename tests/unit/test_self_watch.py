"""A parameter server with no supervisor of ours (torchrun, srun, mpiexec) watches its own pulse
while it serves and once its serving is over (tether.observe.pulse_mark.watch_self): a server
stuck in its final evaluation or save ends itself, saying why, instead of keeping the launcher
waiting for ever; a wait inside one of Tether's own bounded receives is not stillness. Each case
in its own interpreter (the watch ends a process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tether.observe.pulse_mark import PULSE_MARK_ENV

# Serving is over; the server beats `beats` times 0.3 s apart (a final evaluation's batches),
# then stands still for `hang` s (the watch's timeout is 1 s), then is done (stop_watching, as
# the runner does once the results are written) and lingers 1.5 s more before exiting.
SCRIPT = """
import sys, time
from tether.observe.pulse_mark import beat, start_pulse, stop_watching, watch_self
start_pulse(1)
watch_self("server rank 0", 1.0)
for _ in range({beats}):
    time.sleep(0.3)
    beat()
time.sleep({hang})
stop_watching()
time.sleep(1.5)
print("exited by itself")
"""


def _run(beats: int, hang: float, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(beats=beats, hang=hang)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_a_hung_server_ends_itself_naming_itself_and_where_it_hung() -> None:
    code, output, took = _run(beats=6, hang=20)  # 1.8 s of beats, longer than the timeout
    assert code == 1, output
    assert output.startswith(
        "tether: server rank 0 stopped answering after every worker had finished: its pulse"
    ), output
    assert "stood still for 1 s (--timeout 1 s)" in output
    assert "line 9, in <module>" in output and "thread MainThread:" in output  # the sleep
    assert "exited by itself" not in output
    assert took < 10, took  # 1.8 s of beats, the 1 s timeout (not the 20 s hang)


def test_a_server_that_beats_and_finishes_is_left_alone() -> None:
    code, output, _ = _run(beats=6, hang=0.5)
    assert (code, output.strip()) == (0, "exited by itself")


def test_a_server_with_a_supervisor_leaves_the_watch_to_it(tmp_path: Path) -> None:
    # The supervisor names the pulse file and ends a hung server itself: no second watch.
    code, output, _ = _run(beats=0, hang=2.5, env={PULSE_MARK_ENV: str(tmp_path / "pulse")})
    assert (code, output.strip()) == (0, "exited by itself")


# A round-robin server's read of its next worker, bounded by the wire's timeout (here 2.5 s, the
# watch's 1 s), then `after` s standing still outside any wait.
WAITING = """
import time
from tether.observe.pulse_mark import start_pulse, stop_watching, waiting, watch_self
start_pulse(1)
watch_self("server rank 0", 1.0, "while it served its workers")
with waiting():
    time.sleep(2.5)
time.sleep({after})
stop_watching()
print("exited by itself")
"""


def test_a_wait_in_a_bounded_receive_is_not_stillness_but_what_follows_is() -> None:
    # Without `waiting`, the watch would end a round-robin server waiting its turn on a slow
    # worker; the wait's end beats, so stillness counts from there.
    for after, code, said in [(0.5, 0, "exited by itself"), (20, 1, "stopped answering")]:
        done = subprocess.run(
            [sys.executable, "-c", WAITING.format(after=after)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == code, done.stdout + done.stderr
        assert said in done.stdout + done.stderr
        if code:
            assert "while it served its workers stood still for 1 s" in done.stderr


FULL_PIPE = """
import sys
from tether.observe.pulse_mark import start_pulse, watch_self
start_pulse(1)
watch_self("server rank 0", 1.0)
sys.stderr.write("x" * 1_000_000)  # nobody reads the pipe: stuck in the write, its lock held
sys.stderr.flush()
"""


def test_a_server_stuck_writing_to_a_full_stderr_still_ends() -> None:
    # Before, the watch printed through sys.stderr, whose lock the stuck main thread held:
    # the watch blocked too and the process never ended (found by review).
    proc = subprocess.Popen(
        [sys.executable, "-c", FULL_PIPE], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        code = proc.wait(timeout=20)  # the stderr pipe is never read while it runs
    finally:
        proc.kill()
        assert proc.stderr is not None
        proc.stderr.close()
    assert code == 1
