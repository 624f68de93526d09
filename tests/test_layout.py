"""The generic top-level names must resolve to this project, not to a PyPI package (e.g. `llm`)."""
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["agent", "asr", "llm", "tts", "transport"])
def test_top_level_package_is_ours(name):
    mod = importlib.import_module(name)
    assert Path(mod.__file__).resolve().is_relative_to(ROOT), f"{name} resolves to {mod.__file__}"


def test_models_do_not_import_transports():
    for pkg in ("asr", "llm", "tts"):
        for f in (ROOT / pkg).rglob("*.py"):
            text = f.read_text()
            assert "import transport" not in text and "from transport" not in text, f
    for f in (ROOT / "transport").rglob("*.py"):
        text = f.read_text()
        assert "from agent" not in text and "import agent" not in text, f
