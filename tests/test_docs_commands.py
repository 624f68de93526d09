"""The command lines of README.md and docs/*.md, run (issue 42): what tests/test_docs.py only
parses, here starts, answers and stops. Reads the pages with test_docs.py's own reader.

How each line runs is decided by one table, `HOW` (first match wins):
- a server (`duplex serve`, `duplex asr-serve`, `make serve`, `python -m examples.pipecat_bot`)
  starts in a temp dir with each port it names (`--port`, `--audiosocket`, `--metrics-port`,
  `PORT=`, a listener's `=PORT`, and the same port in a ws:// URL) replaced by a free loopback
  port, `--port FREE` added where it names none; `--host 0.0.0.0` (or `HOST=0.0.0.0`) stays only
  when the line also carries what a public bind needs (`--insecure-no-auth`, or DUPLEX_AUTH_TOKEN
  in its own env prefix) and is otherwise replaced by 127.0.0.1, as the test talks to loopback
  only. It is ready when /readyz answers 200 (pipecat's bot: when its port accepts), polled while
  the process lives; then SIGTERM (pipecat's example bot: SIGINT, its Ctrl-C), and it must exit 0.
- a one-shot command (`duplex run`, `duplex trace report`, `duplex talk --list-devices`) runs in a
  temp dir holding the inputs it names (each `--input` a short flite question; a trace it reads is
  made by the docs' own `duplex run ... --trace FILE` line first), exits 0, and leaves the outputs
  it names (`--output`, `--trace`, `--log`, `--json FILE`, a non-empty `--png-dir`). The benches no
  other test runs whole (`duplex bench turns|tools|pipecat`) run so, at the size `SMALLER` gives;
  a bench another test runs smaller is marked with that test's name in the docs.
- a client of a server (`python -m transport.webrtc.bench URL`) runs against the unskipped server
  line nearest above it on its page, started as above, its URL's port made that server's and its
  size made `SMALLER` (one turn); it exits 0.
- `pytest` (also `make test`) lines are CI's own run: reported, not run again.
A line whose trailing comment starts with "needs" or "not checked" is skipped with that reason;
a line of ours that `HOW` does not know and that carries no such mark fails. `my_agent.py`, the
docs' name for the reader's agent file, is examples/weather_agent.py copied into the temp dir.
`test_the_plan` prints every line with what was done with it.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import test_docs as docs
from helpers import flite_available, free_port, say

pytestmark = [pytest.mark.models,
              pytest.mark.skipif(not flite_available(), reason="flite makes the questions")]

ROOT = docs.ROOT
VENV_BIN = ROOT / ".venv" / "bin"
START_S = 180.0  # a server's model load, on a busy 2-core machine
STOP_S = 60.0  # SIGTERM drains: up to the line's --drain-timeout
ONCE_S = 240.0

# (pattern over "program args" with the program's directory dropped, how it runs, a server's
# ready probe, the signal that stops it)
HOW = [
    (r"^duplex (serve|asr-serve)\b", "server", "readyz", signal.SIGTERM),
    (r"^make serve\b", "server", "readyz", signal.SIGTERM),
    # the example bot runs in a terminal and stops on Ctrl-C; it has no SIGTERM handler
    (r"^python\S* -m examples\.pipecat_bot\b", "server", "port", signal.SIGINT),
    (r"^duplex (run|trace report)\b", "once", None, None),
    (r"^duplex talk --list-devices$", "once", None, None),
    (r"^duplex bench (turns|tools|pipecat)\b", "once", None, None),
    (r"^python\S* -m transport\.webrtc\.bench\b", "client", None, None),
    (r"^make test\b|^python\S* -m pytest\b", "ci", None, None),
]
# The size a bench or client runs at here (flag: value, None for a switch): no other test runs these
# whole, and one question or turn shows the command works end to end in seconds.
SMALLER = {
    "duplex bench turns": {"--voices": "slt", "--sentences": "1", "--no-dev": None, "--no-curve": None},
    "duplex bench tools": {"--requests": "1"},
    "duplex bench pipecat": {"--questions": "1", "--warmup": "0"},
    "python -m transport.webrtc.bench": {"--turns": "1"},
}
QUESTIONS = {"q2.wav": "And what about tomorrow?"}
QUESTION = "What is the weather in Paris today?"
PORT_FLAGS = ("--port", "--audiosocket", "--metrics-port")


def key_of(command: str) -> str:
    """The line with its program's directory dropped: `.venv/bin/duplex` and `duplex` are one."""
    program, args, env = docs.program_and_args(command)
    return shlex.join([*env, program.rsplit("/", 1)[-1], *args])


def how_of(command: str):
    program, args, env = docs.program_and_args(command)
    text = shlex.join([program.rsplit("/", 1)[-1], *args])
    for pattern, how, ready, stop in HOW:
        if re.search(pattern, text):
            return how, ready, stop
    return None, None, None


def lines_by_command():
    """{command key: (places, the command, skip reason or None)} for the docs' lines of ours."""
    out: dict[str, list] = {}
    for page, number, command, comment in docs.command_lines():
        if not docs.kind_of_line(command) or not docs.program_and_args(command):
            continue
        key = key_of(command)
        entry = out.setdefault(key, [[], command, None])
        entry[0].append(f"{docs.rel(page)}:{number}")
        if docs.SKIP_MARK.match(comment):
            entry[2] = entry[2] or comment
    return out


LINES = lines_by_command()
ALL = [pytest.param(key, id=places[0]) for key, (places, _, _) in LINES.items()]


# --- the line as it runs here -------------------------------------------------------------------

def flag_values(args: list[str], flag: str) -> list[str]:
    out = []
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args):
            out.append(args[i + 1])
        elif word.startswith(flag + "="):
            out.append(word.split("=", 1)[1])
    return out


def localize(program: str, args: list[str], env: list[str]) -> tuple[list[str], dict[str, str], int | None]:
    """(argv, environment, the port to probe) for a docs line run here; see the module docstring."""
    env_vars = dict(e.split("=", 1) for e in env)
    args = list(args)
    name = program.rsplit("/", 1)[-1]
    if name == "make":
        variables = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
        args = [a for a in args if not ("=" in a and not a.startswith("-"))]
        if variables.get("HOST") == "0.0.0.0" and "DUPLEX_AUTH_TOKEN" not in env_vars:
            variables["HOST"] = "127.0.0.1"
        variables["PORT"] = str(free_port())
        argv = ["make", "-s", "-C", str(ROOT), *args, *(f"{k}={v}" for k, v in variables.items())]
        return argv, env_vars, int(variables["PORT"])
    # one free port for each port the line names, wherever it names it
    doc_ports = {v for f in PORT_FLAGS for v in flag_values(args, f)}
    doc_ports |= {m.group(1) for a in flag_values(args, "--listener") if (m := re.search(r"=(\d+)$", a))}
    ports = {p: str(free_port()) for p in doc_ports}
    for old, new in ports.items():
        args = [re.sub(rf"(^|[=:]){old}(?=$|[,/])", rf"\g<1>{new}", a) for a in args]
    if "--host" in args:
        i = args.index("--host")
        if args[i + 1] == "0.0.0.0" and "--insecure-no-auth" not in args and "DUPLEX_AUTH_TOKEN" not in env_vars:
            args[i + 1] = "127.0.0.1"
    probe = None
    if name == "duplex" and args[:1] in (["serve"], ["asr-serve"]):
        if not flag_values(args, "--port"):
            args += ["--port", str(free_port())]
        probe = int(flag_values(args, "--port")[0])
    elif flag_values(args, "--port"):
        probe = int(flag_values(args, "--port")[0])
    exe = str(VENV_BIN / "duplex") if name == "duplex" else sys.executable
    return [exe, *args], env_vars, probe


def prepare(args: list[str], cwd: Path) -> None:
    """The files a line reads: its --input questions, my_agent.py, examples/ (for `PYTHONPATH=.`
    and `examples/...` paths, as from the checkout's root)."""
    (cwd / "examples").symlink_to(ROOT / "examples")
    for value in flag_values(args, "--input"):
        path = cwd / value.split("@")[0]
        if not path.exists():
            say(QUESTIONS.get(path.name, QUESTION), path)
    for value in flag_values(args, "--agent"):
        file = value.split(":")[0]
        if file.endswith(".py") and not (cwd / file).exists():
            shutil.copy(ROOT / "examples" / "weather_agent.py", cwd / file)


def outputs(args: list[str]) -> list[str]:
    # `--json` alone (trace report) prints JSON; `--json FILE` (a bench) writes FILE
    return [v for f in ("--output", "--trace", "--log", "--png-dir", "--json", "--keep-logs")
            for v in flag_values(args, f) if not v.startswith("-")]


def smaller(command: str, argv: list[str]) -> list[str]:
    """argv at the size `SMALLER` gives the line's program, if any."""
    program, args, _ = docs.program_and_args(command)
    words = [program.rsplit("/", 1)[-1], *args]
    name = next((n for n in SMALLER if words[:len(n.split())] == [re.sub(r"^python\S*", "python", w)
                                                                  for w in n.split()]), None)
    argv = list(argv)
    for flag, value in SMALLER.get(name, {}).items():
        if flag in argv and value is not None:
            argv[argv.index(flag) + 1] = value
        elif flag not in argv:
            argv += [flag] if value is None else [flag, value]
    return argv


def log_tail(log: Path, n: int = 3000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else ""


def descendants(pid: int) -> list[int]:
    out = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            out += [int(child), *descendants(int(child))]
    return out


def ready(kind: str, port: int) -> bool:
    if kind == "port":
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", port)) == 0
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def serving(argv, env, cwd: Path, probe_kind: str, port: int, stop: signal.Signals):
    """Start, wait for readiness while the process lives; after the body, `stop` (SIGTERM) and
    expect exit 0 (killed, if the body or the stop fails); yields the log's path."""
    log = cwd / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1", **env),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while proc.poll() is None and not ready(probe_kind, port) and time.monotonic() < deadline:
            time.sleep(0.2)  # a poll interval, bounded by the deadline and the process's life
        assert proc.poll() is None, f"exited with {proc.returncode} before it was ready:\n{log_tail(log)}"
        assert ready(probe_kind, port), f"not ready on :{port} within {START_S:.0f} s:\n{log_tail(log)}"
        yield log
        # make's recipe: stop the server it runs, and make exits with the server's status
        targets = descendants(proc.pid) if argv[0] == "make" else [proc.pid]
        for pid in targets:
            os.kill(pid, stop)
        rc = proc.wait(timeout=STOP_S)
        assert rc == 0, f"exited with {rc} on {stop.name}:\n{log_tail(log)}"
    finally:
        if proc.poll() is None:
            for pid in [*descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()


def server_above(command: str) -> str:
    """The unskipped server line nearest above a client's line on its page: what it talks to."""
    found = None
    for page, number, line, comment in docs.command_lines():
        if line == command:
            assert found, f"{docs.rel(page)}:{number}: `{command}` has no server line above it"
            return found
        if docs.program_and_args(line) and how_of(line)[0] == "server" and not docs.SKIP_MARK.match(comment):
            found = line
    raise AssertionError(f"`{command}` is not in the docs")


def run_once(argv, env, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1", **env),
                          capture_output=True, text=True, timeout=ONCE_S)


# --- traces a `trace report` line reads: made by the docs' own `duplex run` line ----------------

_made: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}


def run_line(command: str, tmp_path_factory):
    """(its directory, its result) of a one-shot docs line, run once for all who ask."""
    if command not in _made:
        cwd = tmp_path_factory.mktemp("once")
        program, args, env = docs.program_and_args(command)
        prepare(args, cwd)
        if args[:2] == ["trace", "report"]:
            shutil.copy(made_by_the_docs(args[2], tmp_path_factory), cwd / args[2])
        argv, env_vars, _ = localize(program, args, env)
        argv = smaller(command, argv)
        print(f"{shlex.join(argv)}")
        _made[command] = cwd, run_once(argv, env_vars, cwd)
    return _made[command]


def producer_of(file: str) -> str:
    for key, (places, command, skip) in LINES.items():
        program, args, _ = docs.program_and_args(command)
        if not skip and args[:1] == ["run"] and file in flag_values(args, "--trace"):
            return command
    raise AssertionError(f"no unskipped `duplex run ... --trace {file}` line in the docs makes {file}")


def made_by_the_docs(file: str, tmp_path_factory) -> Path:
    command = producer_of(file)
    cwd, r = run_line(command, tmp_path_factory)
    assert r.returncode == 0, f"`{command}` (making {file}) exited {r.returncode}:\n{r.stderr[-3000:]}"
    return cwd / file


# --- the checks ---------------------------------------------------------------------------------

def test_the_plan():
    """Every docs line of ours, with what this file does with it: CI's log shows what ran."""
    unknown = []
    for key, (places, command, skip) in LINES.items():
        how = how_of(command)[0]
        size = " smaller: " + shlex.join(extra) if (extra := smaller(command, [])) else ""
        what = f"skipped: {skip}" if skip else {"server": "runs: a server, started and stopped",
                                                "once": f"runs: once, exit 0 and its outputs{size}",
                                                "client": f"runs: against the server line above it{size}",
                                                "ci": "skipped: CI runs pytest itself"}.get(how)
        if what is None:
            unknown.append(f"{', '.join(places)}: `{command}`")
            what = "UNKNOWN: mark it '# needs ...' or add it to HOW"
        print(f"{', '.join(places)}: `{command}` -> {what}")
    assert not unknown, "docs lines neither run nor marked:\n" + "\n".join(unknown)


@pytest.mark.parametrize("key", ALL)
def test_docs_command_runs(key, tmp_path, tmp_path_factory):
    places, command, skip = LINES[key]
    where = ", ".join(places)
    if skip:
        pytest.skip(f"{where}: `{command}` is marked '# {skip}'")
    how, probe_kind, stop = how_of(command)
    if how == "ci":
        pytest.skip(f"{where}: `{command}` is CI's own pytest run")
    assert how, f"{where}: `{command}`: neither run nor marked (see test_the_plan)"
    program, args, env = docs.program_and_args(command)
    if how == "once":
        cwd, r = run_line(command, tmp_path_factory)
    else:
        cwd = tmp_path
        prepare(args, cwd)
        argv, env_vars, port = localize(program, args, env)
        if how == "server":
            print(f"{where}: {shlex.join(argv)}")
            with serving(argv, env_vars, cwd, probe_kind, port, stop) as log:
                pass
            print(log_tail(log, 600))
            return
        server = server_above(command)
        s_program, s_args, s_env = docs.program_and_args(server)
        s_argv, s_env_vars, s_port = localize(s_program, s_args, s_env)
        argv = smaller(command, [re.sub(r"//127\.0\.0\.1:\d+", f"//127.0.0.1:{s_port}", a) for a in argv])
        print(f"{where}: {shlex.join(argv)} against `{server}`")
        _, s_probe, s_stop = how_of(server)
        with serving(s_argv, s_env_vars, cwd, s_probe, s_port, s_stop):
            r = run_once(argv, env_vars, cwd)
    assert r.returncode == 0, f"{where}: `{command}` exited {r.returncode}:\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}"
    for out in outputs(args):
        path = cwd / out
        assert path.exists(), f"{where}: `{command}` did not write {out}"
        if path.is_dir():
            assert any(path.iterdir()), f"{where}: `{command}` left {out}/ empty"


def test_localize_frees_ports_and_keeps_a_public_bind_only_with_auth():
    argv, env, port = localize("duplex", ["serve", "--port", "8201", "--asr", "ws://127.0.0.1:8201,ws://h:82010",
                                          "--host", "0.0.0.0", "--audiosocket", "9092"], [])
    assert port != 8201 and argv[argv.index("--port") + 1] == str(port)
    assert f"ws://127.0.0.1:{port}," in argv[argv.index("--asr") + 1] and argv[argv.index("--asr") + 1].endswith(":82010")
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "9092" not in argv
    argv, _, _ = localize("duplex", ["serve", "--host", "0.0.0.0"], ["DUPLEX_AUTH_TOKEN=x"])
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and "--port" in argv
    argv, _, port = localize("make", ["serve", "HOST=0.0.0.0", "PORT=9000"], [])
    assert "HOST=127.0.0.1" in argv and f"PORT={port}" in argv and port != 9000
