"""The product waits with `asyncio.timeout`, never `asyncio.wait_for`: on Python 3.11 a wait_for
whose awaitable finishes in the same step as a cancel of its task returns the result and drops the
cancel, so a task stopped at a hang-up runs on (the bench client's marks loop held a conversation
open until its outer bound) and a caller that has gone takes a free slot
(tests/test_engine_server.py, the waiter cancelled as the slot frees)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(f for pkg in ("agent", "asr", "llm", "tts", "transport") for f in (ROOT / pkg).rglob("*.py"))


def _wait_fors(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "wait_for" and isinstance(n.func.value, ast.Name) and n.func.value.id == "asyncio"]


def test_no_asyncio_wait_for():
    assert len(SOURCES) > 50  # the packages were found
    found = {str(f.relative_to(ROOT)): lines for f in SOURCES if (lines := _wait_fors(f))}
    assert not found, f"asyncio.wait_for at: {found}"
