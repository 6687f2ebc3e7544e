"""Python source without its comments and docstrings: what the node programs travel as.

Pure. The same program, half the size: every node program travels in the node runtime's
zipapp (`orchestrator.node.runtime`), and an EC2 node's guard in its user data.
"""

from __future__ import annotations

import ast
import io
import tokenize


def compact_source(source: str) -> str:
    """Python `source` without its comments, and with every docstring cut to `""`: the same
    program, half the size."""
    lines = source.splitlines(keepends=True)
    cuts: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if not isinstance(node, _DOCUMENTED) or not body:
            continue
        first = body[0]
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            start = (first.lineno, _column(lines, first.lineno, first.col_offset))
            end_row = first.end_lineno or first.lineno
            end = (end_row, _column(lines, end_row, first.end_col_offset or 0))
            cuts.append((start, end, '""'))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            cuts.append((token.start, token.end, ""))
    for (row, col), (end_row, end_col), text in sorted(cuts, reverse=True):
        head = lines[row - 1][:col] + text if text else lines[row - 1][:col].rstrip(" ")
        lines[row - 1 : end_row] = [head + lines[end_row - 1][end_col:]]
    return "".join(lines)


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _column(lines: list[str], row: int, byte_offset: int) -> int:
    """The character column of `ast`'s UTF-8 `byte_offset` in line `row`."""
    return len(lines[row - 1].encode()[:byte_offset].decode())
