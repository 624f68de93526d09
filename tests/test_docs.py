"""The README and docs/ as a newcomer meets them: a short README, links that lead somewhere, and
command lines that the real `duplex` parser accepts. Fast: no models, no network, nothing runs.

What is checked, in README.md and docs/*.md:
- README.md has at most 200 lines, and links every page of docs/;
- the README's agent example is examples/weather_agent.py as it is (tests/test_agent_example.py runs it);
- every relative link points to a file that exists (and, for a `#anchor` into a Markdown file, to
  one of its headings);
- every command line in a fenced code block (a line continued with a backslash is one line):
  `duplex ...` (also `.venv/bin/duplex`, after `VAR=value` prefixes) is parsed by `agent.serving.cli.main`
  with the commands themselves replaced by recorders; a sub-command `main` hands to another
  module (asr-serve, asr-bench, trace report, bench ...) is parsed by that module's own parser.
  `make ...` names targets (and `VAR=value` variables) of the Makefile; `python -m MODULE` and
  `python scripts/X.py` name a module or script of this checkout.
- A line whose trailing comment starts with "needs" or "not checked" (`# needs a GPU`) is skipped,
  and reported as skipped with its place and reason.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 200
SKIP_MARK = re.compile(r"^(needs\b|not checked\b)", re.I)
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
NOT_SHELL = {"python", "py", "yaml", "yml", "json", "javascript", "js", "html", "ini", "toml", "xml", "text"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- reading Markdown ---------------------------------------------------------------------------

def fenced_blocks(text: str):
    """(language, first line number, lines) of each fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i + 2
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        yield lang, start, body
        i += 1


def prose(text: str, inline_code: bool = False) -> str:
    """The text without fenced blocks and, unless `inline_code`, without inline code (links
    inside code are not links)."""
    out, inside = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if inside is None and m:
            inside = m.group(1)
            out.append("")
            continue
        if inside is not None:
            if line.strip().startswith(inside):
                inside = None
            out.append("")
            continue
        out.append(line if inline_code else re.sub(r"(`+).*?\1", "", line))
    return "\n".join(out)


LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)


def links(text: str) -> list[str]:
    body = prose(text)
    return LINK.findall(body) + REF_LINK.findall(body)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text(), inline_code=True).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def shell_lines(text: str):
    """(line number, command line, its trailing comment) for every shell line in fenced blocks;
    a line ending in a backslash goes on on the next."""
    for lang, start, body in fenced_blocks(text):
        if lang in NOT_SHELL:
            continue
        j = 0
        while j < len(body):
            number, line = start + j, body[j]
            while line.rstrip().endswith("\\") and j + 1 < len(body):
                j += 1
                line = line.rstrip()[:-1].rstrip() + " " + body[j].strip()
            j += 1
            m = re.search(r"(?:^|\s)#(.*)$", line)
            comment = m.group(1).strip() if m else ""
            command = (line[:m.start()] if m else line).strip().removeprefix("$ ").strip()
            if command:
                yield number, command, comment


def command_lines():
    """(page, line number, command line, its trailing comment) in the README and docs/."""
    return [(page, *found) for page in PAGES for found in shell_lines(page.read_text())]


def program_and_args(command: str) -> tuple[str, list[str], list[str]] | None:
    """(program, its arguments, the VAR=value prefixes), or None for a line that is not a command."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    env = []
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        env.append(words.pop(0))
    if not words:
        return None
    return words[0], words[1:], env


def kind_of(program: str, args: list[str]) -> str | None:
    name = program.rsplit("/", 1)[-1]
    if name == "duplex":
        return "duplex"
    if name == "make":
        return "make"
    if re.fullmatch(r"python[\d.]*", name) and args and (args[0] == "-m" or args[0].endswith(".py")):
        return "python"
    return None


def kind_of_line(command: str) -> str | None:
    """The kind of a command line, judged from its first words even when it does not split
    (an unbalanced quote is then that line's failure, not a reason to skip it)."""
    parsed = program_and_args(command)
    if parsed:
        return kind_of(parsed[0], parsed[1])
    first = re.match(r"^(?:[A-Za-z_]\w*=\S*\s+)*(\S+)", command)
    return kind_of(first.group(1), ["-m"]) if first else None


CHECKED = [pytest.param(page, command, comment, kind, id=f"{rel(page)}:{number}")
           for page, number, command, comment in command_lines()
           if (kind := kind_of_line(command))]


# --- the checks ---------------------------------------------------------------------------------

def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; keep it at most {MAX_README_LINES} and move detail to docs/"


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in links(README.read_text())}
    missing = [rel(p) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_readme_agent_is_the_example_file():
    example = (ROOT / "examples" / "weather_agent.py").read_text().rstrip("\n")
    blocks = ["\n".join(body).rstrip("\n") for lang, _, body in fenced_blocks(README.read_text()) if lang == "python"]
    assert example in blocks, "README.md's 'Your own agent' must show examples/weather_agent.py exactly as it is"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {rel(dest)})")
    assert not broken, f"{rel(page)}: broken links: {broken}"


def test_command_lines_were_found():
    kinds = {p.values[3] for p in CHECKED}
    assert {"duplex", "make"} <= kinds, f"expected duplex and make command lines in the docs, found {kinds}"


class _Parsed(Exception):
    """Raised right after a delegated module's parser accepted its arguments: nothing runs."""


def _parse_delegated(module: str, argv: list[str], monkeypatch) -> None:
    mod = importlib.import_module(module)
    if hasattr(mod, "parse_args"):
        mod.parse_args(argv)
        return
    if hasattr(mod, "build_parser"):
        mod.build_parser().parse_args(argv)
        return
    # a main() that builds its parser inline: stop it right after parsing
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed):
        mod.main(argv)


def check_duplex(args: list[str], monkeypatch, capsys) -> None:
    import agent.serving.cli as cli

    ran = []
    for name in ("cmd_serve", "cmd_run", "cmd_talk"):
        monkeypatch.setattr(cli, name, lambda a, _name=name: ran.append((_name, a)) or 0)
    monkeypatch.setattr(cli, "_delegate", lambda module, argv: ran.append((module, argv)) or 0)
    try:
        cli.main(list(args))
    except SystemExit as exc:  # --help exits 0 once it has printed; argparse errors exit 2
        assert exc.code in (0, None), f"`duplex {shlex.join(args)}` does not parse: {capsys.readouterr().err}"
        return
    assert len(ran) == 1, f"`duplex {shlex.join(args)}` ran {ran}"
    target, argv = ran[0]
    if not target.startswith("cmd_"):
        try:
            _parse_delegated(target, argv, monkeypatch)
        except SystemExit as exc:
            assert exc.code in (0, None), \
                f"`duplex {shlex.join(args)}` does not parse ({target}'s parser): {capsys.readouterr().err}"


def make_targets_and_variables() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set()
    for m in re.finditer(r"^([^\s:#=][^:=]*?)\s*:(?!=)", text, re.M):
        targets.update(t for t in m.group(1).split() if not t.startswith("."))
    variables = set(re.findall(r"^([A-Za-z_]\w*)\s*[?:+]?=", text, re.M))
    variables |= set(re.findall(r"\$[({]([A-Za-z_]\w*)[)}]", text))
    return targets, variables


def check_make(args: list[str]) -> None:
    targets, variables = make_targets_and_variables()
    for word in args:
        if word.startswith("-"):
            continue
        if "=" in word:
            name = word.split("=", 1)[0]
            assert name in variables, f"make variable {name} is not one the Makefile reads ({sorted(variables)})"
        else:
            assert word in targets, f"make target {word!r} is not in the Makefile ({sorted(targets)})"


def check_python(args: list[str]) -> None:
    """`python -m MODULE`: a module of this checkout, or an installed one; `python FILE.py`: a
    file here. Paths among the arguments (a test file for pytest) must exist too."""
    if args[0] == "-m":
        parts = args[1].split(".")
        if (ROOT / parts[0]).is_dir() or (ROOT / f"{parts[0]}.py").is_file():
            base = ROOT.joinpath(*parts)
            assert base.with_suffix(".py").is_file() or (base / "__main__.py").is_file(), \
                f"python -m {args[1]}: no such module in this checkout"
        else:
            assert importlib.util.find_spec(parts[0]) is not None, f"python -m {args[1]}: not installed"
        rest = args[2:]
    else:
        assert (ROOT / args[0]).is_file(), f"python {args[0]}: no such script"
        rest = args[1:]
    for word in rest:
        path = word.split("::")[0]
        if re.match(r"^(tests|scripts|examples)/\S+\.py$", path):
            assert (ROOT / path).is_file(), f"{path}: no such file"


@pytest.mark.parametrize("page,command,comment,kind", CHECKED)
def test_command_line(page, command, comment, kind, monkeypatch, capsys):
    if SKIP_MARK.match(comment):
        pytest.skip(f"{rel(page)}: `{command}` is marked '# {comment}' and is not checked")
    parsed = program_and_args(command)
    assert parsed, f"{rel(page)}: `{command}` does not split into words (shell quoting)"
    program, args, _env = parsed
    if kind == "duplex":
        check_duplex(args, monkeypatch, capsys)
    elif kind == "make":
        check_make(args)
    else:
        check_python(args)


@pytest.mark.parametrize("line", [
    "duplex serve --no-such-flag", "duplex bench nothing", "duplex run --output x.wav",
    "duplex asr-serve --slots many", "duplex trace report", "duplex bench load --sessions 0",
    "duplex asr-bench --clients four",
])
def test_the_checker_rejects_what_does_not_parse(line, monkeypatch, capsys):
    with pytest.raises(AssertionError):
        check_duplex(program_and_args(line)[1], monkeypatch, capsys)


def test_the_checker_rejects_unknown_make_targets():
    with pytest.raises(AssertionError):
        check_make(["deploy"])
    with pytest.raises(AssertionError):
        check_make(["serve", "NOPE=1"])


def test_the_reader_joins_continued_lines_and_sees_skip_marks():
    text = "```sh\nduplex serve --port 8080 \\\n  --max-sessions 4   # the page\n" \
           "duplex asr-serve --device cuda   # needs a GPU\n```\n```python\nduplex = 1\n```\n"
    found = list(shell_lines(text))
    assert found == [(2, "duplex serve --port 8080 --max-sessions 4", "the page"),
                     (4, "duplex asr-serve --device cuda", "needs a GPU")]
    assert not SKIP_MARK.match(found[0][2]) and SKIP_MARK.match(found[1][2])
