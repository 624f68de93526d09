"""The CPU topology the session's defaults are chosen by."""
from __future__ import annotations

import os

from agent.workers import physical_cores


def _topology(root, siblings) -> str:
    for c in sorted(os.sched_getaffinity(0)):
        d = root / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(siblings(c) + "\n")
    return str(root)


def test_hyperthreads_of_one_core_count_once(tmp_path):
    cpus = os.sched_getaffinity(0)
    assert physical_cores(_topology(tmp_path / "smt", lambda c: "0-63")) == 1
    assert physical_cores(_topology(tmp_path / "cores", lambda c: str(c))) == len(cpus)
    assert physical_cores(str(tmp_path / "none")) == len(cpus)  # no topology: each CPU counts
