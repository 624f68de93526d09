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


# ---- the import graph (docs/architecture.md, "Packages, and what each may import") ---------------
PACKAGES = ("agent", "asr", "llm", "tts", "transport")
# agent/'s rooms, each with the rooms it may import; a room is below every room that imports it
AGENT_ROOMS = {
    "agent.workers": set(),
    "agent.tracing": set(),
    "agent.toolkit": {"agent.workers"},
    "agent.conversation": {"agent.toolkit", "agent.tracing", "agent.workers"},
    "agent.pipecat_services": {"agent.conversation", "agent.workers"},
    "agent.serving": {"agent.conversation", "agent.toolkit", "agent.tracing", "agent.workers"},
    "agent.bench": {"agent.conversation", "agent.toolkit", "agent.tracing", "agent.workers", "agent.serving",
                    "agent.pipecat_services"},
}
# asr/'s rooms: its top-level modules (the interface, the VAD, the client recognizers and the
# protocol), then the engine, the server over it, and its benchmark
ASR_ROOMS = {
    "asr": set(),
    "asr.engine": {"asr"},
    "asr.serving": {"asr", "asr.engine"},
    "asr.bench": {"asr", "asr.engine", "asr.serving"},
}
ROOMS = {**AGENT_ROOMS, **ASR_ROOMS}
# the top-level packages each may import besides itself (the models and the transports: only themselves)
MAY_IMPORT = {"agent": {"asr", "llm", "tts", "transport"}, "asr": set(), "llm": set(), "tts": set(),
              "transport": set()}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the project's modules (function-level imports included)."""
    import ast

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    found.add(target)
        graph[name] = found
    return graph


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """The import graph, read once for the tests below (each module parsed: about 0.3 s)."""
    return _imports(_modules())


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "agent":
        return ".".join(parts[:2])
    if parts[0] == "asr" and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0]


def test_each_package_and_room_imports_only_what_it_may(graph):
    wrong = []
    for module, targets in graph.items():
        room = _room(module)
        for target in targets:
            there = _room(target)
            if there == room or (module in ("agent", "asr") and target.startswith(module + ".")):
                continue  # a package's __init__ names its public API (loaded lazily)
            top, top_there = room.split(".")[0], there.split(".")[0]
            if top != top_there:
                ok = top_there in MAY_IMPORT[top]
            else:
                ok = there in ROOMS.get(room, set())
            if not ok:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_nothing_of_the_product_imports_a_benchmark(graph):
    benches = ("agent.bench", "asr.bench")
    assert not [m for m, ts in graph.items() if not m.startswith(benches) and m not in ("agent", "asr")
                and any(t.startswith(benches) for t in ts)]


def test_no_module_imports_in_a_circle(graph):
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path + [module, target]
            if target not in state and (circle := visit(target, path + [module])):
                return circle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module, [])):
            raise AssertionError(" -> ".join(circle))
