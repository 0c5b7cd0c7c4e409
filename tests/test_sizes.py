"""Sizes a reader can hold (#40): no source file in healer/ over 500 lines, no function over 80.

Every offender found by #40 is split; the lists below are empty and only an exemption argued in review
may enter them (the test fails on an entry that is no longer over, so they only shrink). A generated
table would be exempt with a comment saying so where it is generated; healer has none today.
"""

from __future__ import annotations

import ast
import pathlib

import healer

PACKAGE = pathlib.Path(healer.__file__).parent
ROOT = PACKAGE.parent
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
SOURCES = (".py", ".c", ".h", ".js")

FILES_STILL_OVER: frozenset[str] = frozenset()

FUNCTIONS_STILL_OVER: frozenset[str] = frozenset()


def long_files(root: pathlib.Path = PACKAGE) -> set[str]:
    return {
        str(p.relative_to(root.parent))
        for p in root.rglob("*")
        if p.suffix in SOURCES and p.is_file() and len(p.read_text().splitlines()) > MAX_FILE_LINES
    }


def long_functions(root: pathlib.Path = PACKAGE) -> set[str]:
    found = set()
    for p in root.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    found.add(f"{p.relative_to(root.parent)}:{node.name}")
    return found


def test_no_new_file_over_the_limit_and_the_list_is_current() -> None:
    over = long_files()
    assert sorted(over - FILES_STILL_OVER) == [], f"over {MAX_FILE_LINES} lines: split by role"
    assert sorted(FILES_STILL_OVER - over) == [], "split already: take it off FILES_STILL_OVER"


def test_no_new_function_over_the_limit_and_the_list_is_current() -> None:
    over = long_functions()
    assert sorted(over - FUNCTIONS_STILL_OVER) == [], f"over {MAX_FUNCTION_LINES} lines: split it"
    assert sorted(FUNCTIONS_STILL_OVER - over) == [], "split already: take it off FUNCTIONS_STILL_OVER"


def test_the_checks_count_lines_as_a_reader_does(tmp_path: pathlib.Path) -> None:
    """A function of exactly 80 lines and a file of exactly 500 pass; one line more does not."""
    pkg = tmp_path / "pkg"
    (pkg / "static").mkdir(parents=True)

    def function(name: str, lines: int) -> str:
        return f"def {name}():\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 1))

    (pkg / "fits.py").write_text(function("short", MAX_FUNCTION_LINES) + "\n" * 10)
    (pkg / "long.py").write_text(function("long", MAX_FUNCTION_LINES + 1))
    (pkg / "static" / "app.js").write_text("x;\n" * (MAX_FILE_LINES + 1))
    (pkg / "ok.c").write_text("x;\n" * MAX_FILE_LINES)
    assert long_functions(pkg) == {"pkg/long.py:long"}
    assert long_files(pkg) == {"pkg/static/app.js"}
