"""The generated parts of the user docs: the job spec field table and the CLI reference.

Both are built from the code itself (the pydantic models of `orchestrator.spec.model`, the typer app
of `orchestrator.cli.app`), so a field or flag cannot exist without being documented. Each lives
in a markdown file between two marker lines:

    <!-- generated:NAME:begin (make docs; edits here are lost) -->
    ...
    <!-- generated:NAME:end -->

`python -m orchestrator.cli.reference` (`make docs`) rewrites those sections in place;
`stale_sections()` says which ones differ from what the code gives (the docs tests use it).
"""

from __future__ import annotations

import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from orchestrator.errors import OrchError

__all__ = [
    "GENERATED",
    "cli_reference",
    "render_sections",
    "spec_field_rows",
    "spec_table",
    "stale_sections",
    "write_sections",
]

REPO = Path(__file__).resolve().parents[2]

_BEGIN = "<!-- generated:{name}:begin (make docs; edits here are lost) -->"
_END = "<!-- generated:{name}:end -->"


class UndocumentedError(OrchError):
    """A spec field or CLI parameter has no description to put in the docs."""

    exit_code = 2


# --------------------------------------------------------------------------------------------
# The job spec


def _validator_names(annotation: Any) -> set[str]:
    """Names of the BeforeValidator functions in an Annotated type (nested ones too)."""
    names: set[str] = set()
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, BeforeValidator):
            names.add(getattr(meta.func, "__name__", ""))
    return names


def _type_text(annotation: Any, metadata: list[Any] | None = None) -> str:
    """A reader's name for a field's type: `integer`, `duration`, `USD`, `"a" or "b"`..."""
    validators = _validator_names(annotation)
    for meta in metadata or []:
        if isinstance(meta, BeforeValidator):
            validators.add(getattr(meta.func, "__name__", ""))
    if "parse_duration" in validators:
        return "duration"
    if "_deadline_value" in validators:
        return "UTC time or duration"
    if "_spot_value" in validators:
        return 'true, false or "auto"'
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0], list(args[1:]))
    if origin in (typing.Union, types.UnionType):
        parts = [_type_text(arg) for arg in args if arg is not type(None)]
        return " or ".join(dict.fromkeys(parts))
    if origin is typing.Literal:
        return ", ".join(f"`{value}`" for value in args)
    if origin is list:
        return f"list of {_type_text(args[0])}"
    if origin is dict:
        return "mapping of name to string"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {
        bool: "true/false",
        int: "integer",
        float: "number",
        str: "string",
        Decimal: "USD",
        datetime: "UTC time",
    }
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default_text(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, list | dict) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    return f"`{value}`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds directly, as list items (`list[DataMount]`) or optionally
    (`ContainerSpec | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType):
        held = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _model_of(held[0]) if len(held) == 1 else None
    if typing.get_origin(annotation) is list:
        item = typing.get_args(annotation)[0]
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def spec_field_rows(model: type[BaseModel] | None = None, prefix: str = "") -> Iterator[tuple]:
    """(dotted name, type, default, description) of every field of the job spec, depth first.

    Raises UndocumentedError naming a field without a description."""
    if model is None:
        from orchestrator.spec.model import JobSpec

        model = JobSpec
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        if not (field.description or "").strip():
            raise UndocumentedError(
                f"spec field {dotted} has no description",
                hint="give it Field(description=...) in orchestrator/spec/model.py",
            )
        nested = _model_of(field.annotation)
        is_list = typing.get_origin(field.annotation) is list
        kind = "list of mappings" if nested is not None and is_list else None
        yield (
            dotted,
            kind or _type_text(field.annotation, list(field.metadata)),
            _default_text(field),
            " ".join(field.description.split()),  # type: ignore[union-attr]
        )
        if nested is not None:
            yield from spec_field_rows(nested, f"{dotted}[]." if is_list else f"{dotted}.")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def spec_table() -> str:
    """The markdown table of every job spec field."""
    lines = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for dotted, kind, default, description in spec_field_rows():
        lines.append(f"| `{dotted}` | {_cell(kind)} | {default} | {_cell(description)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The command line


# typer builds click-like command objects (its own copy of click): read them by duck typing.
Command = Any


def _is_argument(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "argument"


def _is_option(param: Any) -> bool:
    return getattr(param, "param_type_name", "") == "option"


def _commands(group: Command, path: list[str]) -> Iterator[tuple[list[str], Command]]:
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        if hasattr(command, "commands"):
            yield from _commands(command, [*path, name])
        else:
            yield [*path, name], command


def _param_help(param: Any, where: str) -> str:
    text = getattr(param, "help", None) or ""
    if not text.strip():
        raise UndocumentedError(
            f"{where}: parameter {param.name} has no help text",
            hint="give it help=... in its typer.Option or typer.Argument",
        )
    return " ".join(text.split())


def _usage(path: list[str], command: Command) -> str:
    words = ["orch", *path]
    for param in command.params:
        if _is_argument(param):
            name = param.name.upper() if param.name else "ARG"
            name += "..." if param.nargs == -1 or getattr(param, "multiple", False) else ""
            words.append(name if param.required else f"[{name}]")
    if any(_is_option(p) for p in command.params):
        words.append("[OPTIONS]")
    return " ".join(words)


def _option_default(param: Any) -> str:
    default = param.default
    if param.required:
        return "**required**"
    if param.is_flag and not param.secondary_opts:
        return ""
    if default is None or default == () or default == []:
        return ""
    if isinstance(default, bool):
        return param.opts[0] if default else (param.secondary_opts or [""])[0]
    return f"`{default}`"


def cli_reference() -> str:
    """Markdown for every `orch` command: usage, what it does, its arguments and options."""
    import typer.main

    from orchestrator.cli.app import app

    root = typer.main.get_command(app)
    blocks: list[str] = []
    for path, command in _commands(root, []):
        where = "orch " + " ".join(path)
        help_text = (command.help or "").strip()
        if not help_text:
            raise UndocumentedError(f"{where} has no docstring", hint="describe the command")
        lines = [f"### `{where}`", "", "```text", _usage(path, command), "```", ""]
        lines += [_indent_free(help_text), ""]
        rows = []
        for param in command.params:
            if _is_argument(param):
                rows.append((f"`{(param.name or '').upper()}`", _param_help(param, where), ""))
            elif _is_option(param) and not param.hidden:
                names = " / ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
                if param.multiple:
                    names += " (repeatable)"
                rows.append((names, _param_help(param, where), _option_default(param)))
        if rows:
            lines += ["| argument or option | meaning | default |", "| --- | --- | --- |"]
            lines += [f"| {n} | {_cell(h)} | {d} |" for n, h, d in rows]
            lines.append("")
        blocks.append("\n".join(lines).rstrip())
    return "\n\n".join(blocks)


def _indent_free(text: str) -> str:
    """A docstring as markdown paragraphs: its own line breaks joined, paragraphs kept."""
    paragraphs = re.split(r"\n\s*\n", text)
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


# --------------------------------------------------------------------------------------------
# Sections in files

GENERATED: dict[str, tuple[str, Callable[[], str]]] = {
    "spec-fields": ("docs/spec.md", spec_table),
    "cli": ("docs/cli.md", cli_reference),
}
"""Section name -> (file relative to the repository, what fills it)."""


def _section_re(name: str) -> re.Pattern[str]:
    begin = re.escape(_BEGIN.format(name=name))
    end = re.escape(_END.format(name=name))
    return re.compile(f"{begin}\n(.*?)\n?{end}", re.DOTALL)


def render_sections(text: str, name: str, body: str) -> str:
    """`text` with the section `name` holding `body`. OrchError if its markers are missing."""
    pattern = _section_re(name)
    if not pattern.search(text):
        raise OrchError(
            f"no generated:{name} section",
            hint=f"add the lines {_BEGIN.format(name=name)!r} and {_END.format(name=name)!r}",
        )
    replacement = f"{_BEGIN.format(name=name)}\n{body}\n{_END.format(name=name)}"
    return pattern.sub(lambda _: replacement, text, count=1)


def stale_sections(repo: Path = REPO) -> list[str]:
    """Names of the generated sections whose file text differs from what the code gives."""
    stale = []
    for name, (relative, build) in GENERATED.items():
        text = (repo / relative).read_text(encoding="utf-8")
        if render_sections(text, name, build()) != text:
            stale.append(name)
    return stale


def write_sections(repo: Path = REPO) -> list[Path]:
    """Rewrite every generated section; returns the files that changed."""
    changed = []
    for name, (relative, build) in GENERATED.items():
        path = repo / relative
        text = path.read_text(encoding="utf-8")
        updated = render_sections(text, name, build())
        if updated != text:
            path.write_text(updated, encoding="utf-8")
            changed.append(path)
    return changed


def main() -> int:
    """`python -m orchestrator.cli.reference`: bring the generated sections up to date."""
    try:
        changed = write_sections()
    except OrchError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    for path in changed:
        sys.stdout.write(f"updated {path.relative_to(REPO)}\n")
    if not changed:
        sys.stdout.write("generated docs are up to date\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
