"""Comments and docstrings say why, in the present tense: no dates and no machine names.

A figure that decided something names the command that re-measures it (e.g. "`duplex bench
latency` re-measures it"); when and where it was measured belongs in docs/experiments.md. This
walks the tracked source files (`git ls-files`) and lists file:line for every comment or
docstring that holds an ISO date or one of `MACHINE_NAMES`. Fast: no models, no imports of the
project.
"""
from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Where the project's own source lives (docs/, README.md and the like are prose, not code).
FOLDERS = ("agent", "asr", "llm", "tts", "transport", "examples", "scripts", "tests", "deploy", ".ci")
TOP_LEVEL = ("Dockerfile", "Makefile", "pyproject.toml")
SUFFIXES = {".py", ".c", ".h", ".js", ".html", ".sh", ".toml", ".yaml", ".yml"}
HASH_COMMENT_NAMES = {"Dockerfile", "Makefile", "run"}  # no suffix; `#` starts a comment

ISO_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# Names of particular machines or CPU families, and phrases that point at the machine a figure
# happened to be measured on. A comment that needs a CPU feature names the feature (AVX2, AMX).
MACHINE_NAMES = (
    "EPYC",
    "Xeon",
    "Zen 5",
    "Zen 4",
    "Sapphire Rapids",
    "Granite Rapids",
    "Ryzen",
    "this machine",
    "this CPU",
)
MACHINE = re.compile(r"\b(?:" + "|".join(re.escape(n).replace(r"\ ", r"\s+") for n in MACHINE_NAMES) + r")\b",
                     re.IGNORECASE)


def tracked_sources() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *FOLDERS, *TOP_LEVEL], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    files = []
    for rel in filter(None, out.split("\0")):
        p = Path(rel)
        if p.suffix in SUFFIXES or p.name in HASH_COMMENT_NAMES:
            if (ROOT / p).is_file():  # tracked but deleted in the working tree: nothing to read
                files.append(p)
    return sorted(files)


# ---- comment text, by language: (line number, text) ----------------------------------------------

def python_comments(source: str) -> list[tuple[int, str]]:
    found = []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], tok.string))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            doc = body[0].value
            for i, line in enumerate(doc.value.splitlines()):
                found.append((doc.lineno + i, line))
    return found


def c_like_comments(source: str) -> list[tuple[int, str]]:
    """`//` and `/* */` comments of C and JavaScript, skipping string and template literals."""
    found: list[tuple[int, str]] = []
    i, n, line = 0, len(source), 1
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
            i += 1
        elif source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            found.append((line, source[i:end]))
            i = end
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for k, text in enumerate(source[i:end].split("\n")):
                found.append((line + k, text))
            line += source.count("\n", i, end)
            i = end
        elif c in "\"'`":
            i += 1
            while i < n and source[i] != c:
                if source[i] == "\\":
                    i += 1
                elif source[i] == "\n":
                    line += 1
                    if c != "`":  # an unterminated quote ends at the line's end
                        break
                i += 1
            i += 1
        else:
            i += 1
    return found


def html_comments(source: str) -> list[tuple[int, str]]:
    found = []
    for m in re.finditer(r"<!--.*?-->", source, re.DOTALL):
        first = source.count("\n", 0, m.start()) + 1
        found.extend((first + k, text) for k, text in enumerate(m.group(0).split("\n")))
    for m in re.finditer(r"<script[^>]*>(.*?)</script>", source, re.DOTALL | re.IGNORECASE):
        offset = source.count("\n", 0, m.start(1))
        found.extend((offset + k, text) for k, text in c_like_comments(m.group(1)))
    return found


def hash_comments(source: str) -> list[tuple[int, str]]:
    """Shell, TOML, YAML, Dockerfile, Makefile: from an unquoted `#` to the line's end."""
    found = []
    for number, text in enumerate(source.splitlines(), 1):
        quote = None
        for k, c in enumerate(text):
            if quote:
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or text[k - 1].isspace() or text[:k].strip() == ""):
                found.append((number, text[k:]))
                break
    return found


def comments(path: Path, source: str) -> list[tuple[int, str]]:
    if path.suffix == ".py":
        return python_comments(source)
    if path.suffix in {".c", ".h", ".js"}:
        return c_like_comments(source)
    if path.suffix == ".html":
        return html_comments(source)
    return hash_comments(source)


def offences(path: Path, source: str) -> list[str]:
    out = []
    for number, text in sorted(comments(path, source), key=lambda c: c[0]):
        for pattern, what in ((ISO_DATE, "date"), (MACHINE, "machine")):
            m = pattern.search(text)
            if m:
                out.append(f"{path}:{number}: {what} {m.group(0)!r}: {text.strip()[:120]}")
    return out


# ---- the checks -----------------------------------------------------------------------------------

def test_the_scanner_finds_what_it_should_and_nothing_else():
    py = ('"""Module (2026-12-04)."""\n'
          'X = "2026-12-04 in a string is data"\n'
          'def f():\n'
          '    """Timed on this  CPU."""\n'
          '    return 1  # a Zen 5 EPYC\n'
          'Y = 2  # present tense\n')
    hits = offences(Path("m.py"), py)
    assert [h.split(":")[1] for h in hits] == ["1", "4", "5"], hits
    js = ('const u = "https://x/2026-12-04"; // fine\n'
          '/* measured on\n'
          '   a Xeon */\n'
          "let t = `a\n// not a comment 2026-01-01\n`;\n")
    assert [h.split(":")[1] for h in offences(Path("a.js"), js)] == ["3"]
    sh = 'echo "# 2026-01-01"  # fine\nrun  # on this machine\n'
    assert [h.split(":")[1] for h in offences(Path("s.sh"), sh)] == ["2"]
    html = "<p>2026-01-01</p>\n<!-- Ryzen -->\n<script>\nlet a = 1; // 2026-01-02\n</script>\n"
    assert [h.split(":")[1] for h in offences(Path("i.html"), html)] == ["2", "4"]


def test_comments_and_docstrings_carry_no_dates_or_machine_names():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to walk")
    files = tracked_sources()
    assert any(p.suffix == ".py" for p in files), "git ls-files found no Python sources"
    found = []
    for path in files:
        source = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        # comments and docstrings are pieces of the file's text: where neither pattern matches
        # the whole text, none of them can (tokenizing every file costs seconds)
        if ISO_DATE.search(source) or MACHINE.search(source):
            found += offences(path, source)
    assert not found, ("comments and docstrings say why in the present tense; move dates and "
                       "machines to docs/experiments.md:\n" + "\n".join(found))
