"""Reading a job spec from YAML: `load_job(path, overrides)` (contract in `spec.model`).

Every failure is one `SpecError` naming each bad field by its dotted path and YAML line (or the
flag it came from); nothing else escapes for bad input.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec.model import (
    _MERGE_TAG,
    MAX_NESTING,
    MAX_SPEC_BYTES,
    MAX_VALUES,
    JobSpec,
    LoadedJob,
)
from orchestrator.spec.mounts import looks_like_url
from orchestrator.spec.problems import (
    Loc,
    _flag,
    _line_of,
    _Problem,
    _problem_from_error,
    _render,
)
from orchestrator.spec.skypilot import (
    from_skypilot,
    looks_like_skypilot,
    skypilot_notices,
    task_loc,
)
from orchestrator.spec.values import (
    _ENV_NAME_RE,
    _kind,
    _local_path,
    _show,
    expand_references,
)

# --------------------------------------------------------------------------------------------
# Loading


def load_job(
    path: str | os.PathLike[str],
    overrides: Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> LoadedJob:
    """Read, override, validate and resolve the job spec at `path`.

    `overrides` maps dotted keys (`resources.nodes`, `budget.max_cost_usd`, `provider`,
    `env.NAME`) to values that replace the file's before validation; None values are skipped.
    `environ` is the submitting shell's environment (None: this process's), which `env` and
    `secrets` values are resolved against (see `resolve_environment`). Raises SpecError, with
    every problem found, one per line; never any other exception for bad input.
    """
    source = Path(path)
    with contextlib.suppress(RuntimeError):
        source = source.expanduser()
    source = source.absolute()
    text = _read_text(source)
    raw, root = _parse_yaml(text, source)
    if not isinstance(raw, dict):
        got = "an empty file" if raw is None else _kind(raw)
        raise SpecError(
            f"invalid job spec {source}: the top level must be a mapping of fields "
            f"(name: ..., workdir: ..., run: ...), got {got}"
        )
    task = looks_like_skypilot(raw)
    translated: list[_Problem] = []
    notices: list[str] = []
    if task:  # a SkyPilot task: its fields read as orch's
        notices = skypilot_notices(raw)
        raw, refused = from_skypilot(raw, source.stem)
        translated = [_Problem(loc, message) for loc, message in refused]
    applied = _apply_overrides(raw, overrides or {}, source, root)
    resolved = resolve_environment(raw, os.environ if environ is None else environ)

    problems: list[_Problem] = list(resolved)
    spec: JobSpec | None = None
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        found = (_problem_from_error(err) for err in exc.errors())
        problems.extend(p for p in found if p.loc not in {r.loc for r in resolved})
    problems.extend(_path_problems(raw, source.parent, {p.loc for p in problems}))
    if task:
        problems = translated + [replace(p, loc=task_loc(p.loc)) for p in problems]
    if problems or spec is None:
        raise SpecError(_render(problems, source, root, applied))

    base_dir = source.parent
    return LoadedJob(
        spec=spec,
        source=source,
        base_dir=base_dir,
        workdir=spec.workdir_path(base_dir),
        data_sources=spec.data_source_paths(base_dir),
        notices=tuple(notices),
    )


def _read_text(source: Path) -> str:
    """The file's text, at most MAX_SPEC_BYTES, decoded as UTF-8 (a BOM is allowed)."""
    try:
        data = _read_regular_file(source, MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"job spec {source} does not exist") from None
    except IsADirectoryError:
        raise SpecError(
            f"job spec {source} is a directory", hint="give the path of the job's YAML file"
        ) from None
    except PermissionError:
        raise SpecError(f"cannot read job spec {source}: permission denied") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(f"cannot read job spec {source}: {reason}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(
            f"job spec {source} is larger than the limit of 1 MiB ({MAX_SPEC_BYTES} bytes)",
            hint="keep data out of the spec; list it under `data:` instead",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecError(f"job spec {source} is not UTF-8 text (line {line})") from None


def _read_regular_file(source: Path, limit: int) -> bytes:
    """Up to `limit` bytes of `source`; a FIFO, socket or device is refused, never waited on.

    The file is opened without blocking (a FIFO with no writer would otherwise hang here) and
    checked on the open descriptor, so it cannot be swapped between the check and the read.
    """
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(source))
        if not stat.S_ISREG(mode):
            raise SpecError(
                f"job spec {source} is not a regular file ({_file_kind(mode)})",
                hint="give the path of the job's YAML file",
            )
        os.set_blocking(fd, True)
        return fh.read(limit)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"


def _parse_yaml(text: str, source: Path) -> tuple[object, yaml.Node | None]:
    """Parse one YAML document with safe constructors; return the data and its node tree."""
    loader: yaml.SafeLoader | None = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
        if root is None:
            return None, None
        _check_shape(root, source)
        return loader.construct_document(root), root
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
        what = exc.problem or exc.context or "invalid YAML"
        context = ""
        if exc.context and exc.problem and exc.context_mark:
            context = f" ({exc.context} at line {exc.context_mark.line + 1})"
        raise SpecError(f"{source}: invalid YAML at {where}: {what}{context}") from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        char = exc.character
        shown = f"U+{char:04X}" if isinstance(char, int) else repr(char)
        raise SpecError(
            f"{source}: invalid YAML at line {line}: character {shown} is not allowed"
        ) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(f"{source}: invalid YAML: {first}") from None
    except RecursionError:
        raise SpecError(f"{source}: invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


class _Loader(yaml.SafeLoader):
    """The safe loader, with a value that cannot be built (`!!int abc`, an int of 5000 digits)
    reported as a YAML error at its line instead of escaping as some other exception."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as exc:  # noqa: BLE001 - PyYAML's constructors fail in many ways
            # (`!!timestamp ''` raises AttributeError); each is a value it cannot build.
            kind = node.tag.rsplit(":", 1)[-1]
            shown = _show(node.value) if isinstance(node.value, str) else "this value"
            why = " (too many digits)" if "digits" in str(exc) else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"{shown} is not a valid {kind}{why}", node.start_mark
            ) from None


def _check_shape(root: yaml.Node, source: Path) -> None:
    """Refuse duplicate keys, deep nesting, recursive aliases and alias bombs."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise SpecError(
                f"{source}: holds more than {MAX_VALUES} values (counting YAML alias expansions)"
            )
        if depth > MAX_NESTING:
            raise SpecError(
                f"{source}: nested deeper than {MAX_NESTING} levels "
                f"(line {node.start_mark.line + 1}; a recursive alias?)"
            )
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE_TAG:
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        raise SpecError(
                            f"{source}: duplicate key `{key.value}` at line {line} "
                            f"(first at line {seen[key.value]})"
                        )
                    seen[key.value] = line
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, depth + 1) for item in node.value)


def _apply_overrides(
    raw: dict[Any, Any],
    overrides: Mapping[str, object],
    source: Path,
    root: yaml.Node | None,
) -> dict[tuple[str, ...], str]:
    """Set each dotted override in `raw` (in place); return {path parts: dotted key} applied."""
    applied: dict[tuple[str, ...], str] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        parts = tuple(key.split("."))
        if not all(parts):
            raise SpecError(f"invalid override key {key!r}: use dotted field names")
        target = raw
        for i, part in enumerate(parts[:-1]):
            child = target.get(part)
            if child is None:
                child = target[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                line = _line_of(root, parts[: i + 1])
                raise SpecError(
                    f"{_flag(key)}: cannot apply (from the command line): `{where}` in "
                    f"{source.name} (line {line}) is not a mapping"
                )
            target = child
        target[parts[-1]] = value
        applied[parts] = key
    return applied


_UNSET_IN_ENV = (
    "export it before orch submit, or, for a token, list the variable under `secrets:` "
    "(write $$ for a literal $)"
)
_UNSET_IN_SECRETS = "export it before orch submit (write $$ for a literal $)"


def resolve_environment(raw: dict[Any, Any], environ: Mapping[str, str]) -> list[_Problem]:
    """Resolve the `env` and `secrets` values of `raw` (in place) against the submitting
    shell's `environ`: `${NAME}` and `$NAME` become NAME's value and `$$` one `$`, and a
    secret with no value (null) takes the value of the variable of its own name. Returns a
    problem for each value that names a variable `environ` lacks; other values (not strings,
    a mapping that is not one) are left for validation to report.
    """
    problems: list[_Problem] = []
    password = _registry_password_name(raw)
    for section in ("env", "secrets"):
        values = raw.get(section)
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            loc: Loc = (section, str(name))
            if section == "secrets" and value is None:
                if str(name) in environ:
                    values[name] = environ[str(name)]
                else:
                    what = " (the registry password of container.credentials)"
                    problems.append(
                        _Problem(
                            loc,
                            f"has no value and {name} is not set in the submitting shell"
                            f"{what if name == password else ''}: export {name}=... before "
                            f"orch submit, or pass --secret {name}=VALUE",
                        )  # fmt: skip
                    )
            elif isinstance(value, str):
                hint = _UNSET_IN_ENV if section == "env" else _UNSET_IN_SECRETS
                try:
                    values[name] = expand_references(value, environ, unset_hint=hint)
                except ValueError as exc:
                    problems.append(_Problem(loc, str(exc)))
    return problems


def _registry_password_name(raw: dict[Any, Any]) -> object:
    """The secret name `container.credentials.password_secret` gives, if the file has one."""
    container = raw.get("container")
    login = container.get("credentials") if isinstance(container, dict) else None
    return login.get("password_secret") if isinstance(login, dict) else None


def assignment_overrides(
    flag: str, section: str, items: Sequence[str], environ: Mapping[str, str]
) -> dict[str, str]:
    """The overrides (`section.NAME` -> value) of repeated `flag NAME[=VALUE]` arguments
    (`--env`, `--secret`); a NAME without `=VALUE` takes the value of NAME in `environ`, the
    submitting shell. The values are taken as written: a `$` in them is kept (escaped for
    `resolve_environment`). The last of a repeated NAME wins.

    Raises SpecError (exit 2) for a name that is not a variable name and for a NAME without
    a value that `environ` does not hold, naming it and saying how to give it.
    """
    overrides: dict[str, str] = {}
    for item in items:
        name, given, value = item.partition("=")
        if not _ENV_NAME_RE.fullmatch(name):
            raise SpecError(
                f"{flag} {_show(item)}: {_show(name)} is not a variable name",
                hint=f"write {flag} NAME=VALUE, or {flag} NAME to take $NAME from this shell "
                "(letters, digits and '_', not starting with a digit)",
            )
        if not given:
            if name not in environ:
                raise SpecError(
                    f"{flag} {name}: {name} is not set in this shell",
                    hint=f"export {name}=... before orch submit, or pass {flag} {name}=VALUE",
                )
            value = environ[name]
        overrides[f"{section}.{name}"] = value.replace("$", "$$")
    return overrides


def _path_problems(raw: dict[Any, Any], base_dir: Path, known: set[Loc]) -> list[_Problem]:
    """Check that the workdir is a local directory and each local data src exists (a bucket
    is the submit's to check: `cluster.bucket_check`)."""
    problems: list[_Problem] = []
    workdir = raw.get("workdir")
    if isinstance(workdir, str) and ("workdir",) not in known:
        problem = _check_local(workdir, base_dir, want_dir=True)
        if problem:
            problems.append(_Problem(("workdir",), problem))
    mounts = raw.get("data")
    if isinstance(mounts, list):
        for i, mount in enumerate(mounts):
            src = mount.get("src") if isinstance(mount, dict) else None
            loc: Loc = ("data", i, "src")
            if isinstance(src, str) and loc not in known and not looks_like_url(src):
                problem = _check_local(src, base_dir, want_dir=False)
                if problem:
                    problems.append(_Problem(loc, problem))
    return problems


def _check_local(raw: str, base_dir: Path, *, want_dir: bool) -> str | None:
    """None when the local path exists (and is a directory if want_dir), else what is wrong."""
    if not raw.strip() or "\x00" in raw:
        return None  # reported by validation
    path = _local_path(raw, base_dir)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"{'directory ' if want_dir else ''}{path} does not exist"
    except (OSError, ValueError) as exc:
        return f"cannot access {path}: {getattr(exc, 'strerror', None) or exc}"
    if want_dir and not stat.S_ISDIR(mode):
        return f"{path} is not a directory"
    return None
