"""The README says what is true now: its settings table is
``speculative_complete/lsp_server/config.py``'s settings, its flags are the server's and
llama-server's, its test command is what CI runs, and it stays short enough to read.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

from speculative_complete.lsp_server.config import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DETAIL = ROOT / "docs" / "server.md"  # the same settings with everything each accepts
MAX_LINES = 420
TEST_COMMAND = "python -m pytest -q"


def section(text: str, heading: str) -> str:
    """The text under the Markdown heading ``heading`` (any level) up to the next heading of the
    same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.MULTILINE)
    assert match, f"no heading {heading!r}"
    level = len(match.group(1))
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def table_rows(text: str, header: tuple[str, ...]) -> list[list[str]]:
    """The body rows of the one table in ``text`` whose header row is ``header``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if cells(line) == list(header)]
    assert len(starts) == 1, f"expected one table headed {header}, found {len(starts)}"
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return rows


def cells(line: str) -> list[str]:
    if not line.startswith("|"):
        return []
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def code_blocks(text: str, languages: tuple[str, ...] = ("bash", "sh", "shell", "")) -> list[str]:
    return [
        body
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        if lang in languages
    ]


def commands(block: str, program: str) -> list[list[str]]:
    """The commands of a shell block that run ``program``, as words: continuation lines joined,
    comments dropped."""
    joined = re.sub(r"\\\n", " ", block)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if re.match(rf"(\w+=\S+\s+)*{re.escape(program)}\s", line):
            found.append(shlex.split(line, comments=True))
    return found


def settings_table(path: Path, heading: str) -> dict[str, str]:
    rows = table_rows(section(path.read_text(), heading), ("setting", "default", "meaning"))
    names = [row[0] for row in rows]
    assert len(names) == len(set(names)), f"a setting listed twice in {path.name}"
    table = {}
    for row in rows:
        assert re.fullmatch(r"`\w+`", row[0]), f"{path.name}: a settings row not named as `setting`: {row}"
        table[row[0].strip("`")] = row[1]
    return table


def code_settings() -> dict[str, str]:
    """Each setting's LSP name and default, as the code declares them (the ``Settings`` fields)."""
    lsp = Settings().to_lsp()
    assert len(lsp) == len(fields(Settings))
    return {name: f"`{json.dumps(value)}`" for name, value in lsp.items()}


@pytest.mark.parametrize(("path", "heading"), [(README, "Settings"), (DETAIL, "Settings in full")])
def test_the_settings_table_is_every_setting_of_config_and_no_other(path: Path, heading: str) -> None:
    table = settings_table(path, heading)
    declared = code_settings()
    assert sorted(set(declared) - set(table)) == [], f"settings missing from {path.name}'s table"
    assert sorted(set(table) - set(declared)) == [], f"rows in {path.name}'s table that are no setting"
    wrong = {name: (table[name], default) for name, default in declared.items() if table[name] != default}
    assert wrong == {}, f"defaults in {path.name} that are not the code's (table, code)"


def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; keep it at most {MAX_LINES}"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    text = README.read_text()
    after = text[text.index("Run the tests") :]
    first = code_blocks(after, ("bash",))[0].strip()
    assert first == TEST_COMMAND
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    ci = [line for line in ci if line and not line.startswith("#")]
    assert ci[-3:] == ["ruff check .", "ruff format --check .", TEST_COMMAND]


def help_entries(help_text: str) -> list[tuple[list[str], str]]:
    """A ``--help`` text's options: for each, its flags and its description. An option's line
    starts with its flags (at most two spaces in); its description goes on on deeper lines."""
    entries: list[tuple[list[str], list[str]]] = []
    for line in help_text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("-") and len(line) - len(stripped) <= 2:
            flags: list[str] = []
            words = stripped.split()
            rest = words
            for i, word in enumerate(words):
                if not word.startswith("-"):
                    rest = words[i:]
                    break
                flags.append(word.rstrip(","))
                if not word.endswith(","):
                    rest = words[i + 1 :]
                    break
            entries.append((flags, list(rest)))
        elif entries:
            entries[-1][1].append(stripped)
    return [(flags, " ".join(words)) for flags, words in entries]


def test_the_flags_table_is_every_flag_of_lsp_server() -> None:
    from speculative_complete.lsp_server.__main__ import parse_args

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_args(["--help"])
    in_help = {flag for flags, _ in help_entries(out.getvalue()) for flag in flags}
    assert {"--stdio", "--model", "--endpoint"} <= in_help, "lsp_server --help did not list its flags"
    rows = table_rows(section(README.read_text(), "Settings"), ("flag", "meaning"))
    in_table = {flag for row in rows for flag in re.findall(r"`(--?[a-z][a-z-]*)", row[0])}
    assert sorted(in_help - in_table) == [], "lsp_server flags missing from the README's flags table"
    assert sorted(in_table - in_help) == [], "flags in the README's table that lsp_server does not have"


def llama_server_help() -> tuple[set[str], set[str]]:
    """The flags the built llama-server accepts, and those it lists only to say they were removed."""
    from benchmarks.llama_server import LlamaServerError, llama_server_binary

    try:
        binary = llama_server_binary(build=False)
    except LlamaServerError as exc:
        pytest.skip(f"llama-server is not built here ({exc}); .ci/run builds it before the tests")
    help_text = subprocess.run(
        [str(binary), "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    accepted: set[str] = set()
    removed: set[str] = set()
    for flags, description in help_entries(help_text):
        (removed if "has been removed" in description else accepted).update(flags)
    assert {"--port", "--model"} <= accepted, "llama-server --help did not list its flags"
    return accepted, removed - accepted


def test_every_llama_server_flag_shown_is_one_the_built_binary_accepts() -> None:
    shown = []
    for path in (README, DETAIL):
        for block in code_blocks(path.read_text()):
            for words in commands(block, "llama-server"):
                while words and re.fullmatch(r"\w+=.*", words[0]):
                    words = words[1:]  # VAR=value before the command
                if words and words[0] == "llama-server":
                    shown += [(path.name, word.split("=")[0]) for word in words[1:] if word.startswith("-")]
    assert any(name == "README.md" for name, _ in shown), "the README shows no llama-server command"
    accepted, removed = llama_server_help()
    gone = sorted({(name, flag) for name, flag in shown if flag in removed})
    assert gone == [], "llama-server flags shown that this llama.cpp has removed"
    unknown = sorted({(name, flag) for name, flag in shown if flag not in accepted})
    assert unknown == [], "llama-server flags shown that the built binary does not list"
