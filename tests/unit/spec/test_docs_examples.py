"""Every example of the user docs is run (tests/support/doc_blocks.py: how a page marks them).

- `job` examples are loaded with the real spec loader and passed through
  `orch submit NAME --dry-run --json`;
- `run` examples are run as written (cwd: the repository) and must exit as documented, with
  the output shown in `console` blocks;
- `config` examples are read as ORCH_HOME/config.yaml by the real settings loader;
- `covered-by` examples name tests that exist (those launch nodes and run the same thing).

Commands run in this process through `orchestrator.cli.app.main` (exit codes and messages are
exactly the console script's), except `submit` without `--dry-run`, which runs as a real
`orch` process so that nothing it might launch could outlive the test.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from tests.support.doc_blocks import (
    KINDS,
    REPO,
    Block,
    Command,
    blocks,
    covered_by,
    doc_pages,
    output_matches,
    run_commands,
    unmarked_indented_commands,
)
from tests.support.helpers import orch_env, run_orch

PAGES = doc_pages()


def _orch(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """Run `orch ARGS` with `env` (ORCH_* of the test's own environment removed)."""
    if args and args[0] == "submit" and "--dry-run" not in args:
        done = run_orch(args, orch_env(Path(env["ORCH_HOME"]), **env), timeout=120)
        return done.returncode, done.stdout + done.stderr
    from orchestrator.cli import app as cli

    with monkeypatch.context() as patch:
        for name in list(os.environ):
            if name.startswith("ORCH_") or name in ("FORCE_COLOR", "NO_COLOR"):
                patch.delenv(name)
        for name, value in {"COLUMNS": "200", **env}.items():
            patch.setenv(name, value)
        patch.setattr(sys, "argv", ["orch", *args])
        patch.chdir(REPO)
        captured = io.StringIO()
        code: int
        with redirect_stdout(captured), redirect_stderr(captured):
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, captured.getvalue()


def _local_dirs(spec: dict, base: Path) -> None:
    """Create the relative local paths a job example names (a user has them where it runs)."""
    paths = [spec.get("workdir")] + [m.get("src") for m in spec.get("data") or []]
    for raw in paths:
        if isinstance(raw, str) and not raw.startswith(("/", "~")):
            (base / raw).mkdir(parents=True, exist_ok=True)


class Page:
    """The examples of one page, run in order in a directory and ORCH_HOME of their own."""

    def __init__(self, path: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        self.files = tmp / "files"
        self.files.mkdir()
        self.home = tmp / "orch"
        self.monkeypatch = monkeypatch
        self.written: dict[str, Path] = {}
        self.problems: list[str] = []

    def check(self) -> list[str]:
        for block in blocks(self.path):
            if block.kind is None:
                if block.lang != "text":
                    self.problems.append(f"{block.where}: a `{block.lang}` block with no marker")
                continue
            if block.kind not in KINDS:
                self.problems.append(f"{block.where}: unknown example kind {block.kind!r}")
                continue
            getattr(self, "_" + block.kind.replace("-", "_"))(block)
        for line in unmarked_indented_commands(self.path):
            self.problems.append(f"{self.path.relative_to(REPO)}:{line}: unmarked orch command")
        return self.problems

    def _write(self, block: Block, default: str) -> Path:
        name = block.arg or default
        path = self.files / name
        path.write_text(block.text + "\n", encoding="utf-8")
        self.written[name] = path
        return path

    def _file(self, block: Block) -> None:
        if not block.arg:
            self.problems.append(f"{block.where}: `example: file` needs a file name")
            return
        self._write(block, block.arg)

    def _job(self, block: Block) -> None:
        from orchestrator.errors import SpecError
        from orchestrator.spec.loading import load_job

        path = self._write(block, "job.yaml")
        spec = yaml.safe_load(block.text)
        _local_dirs(spec, self.files)
        try:
            loaded = load_job(path)
        except SpecError as exc:
            self.problems.append(f"{block.where}: the job example does not load: {exc}")
            return
        env = {"ORCH_HOME": str(self.home)}
        code, out = _orch(["submit", str(path), "--dry-run", "--json"], env, self.monkeypatch)
        if code != 0:
            self.problems.append(f"{block.where}: dry run exited {code}: {out}")
            return
        document = json.loads(out)
        if document["spec"]["name"] != loaded.spec.name or "plan" not in document:
            self.problems.append(f"{block.where}: unexpected dry-run document {document}")

    def _config(self, block: Block) -> None:
        from orchestrator.config import load_settings
        from orchestrator.errors import ConfigError

        home = self.files / "config-home"
        home.mkdir(exist_ok=True)
        (home / "config.yaml").write_text(block.text + "\n", encoding="utf-8")
        try:
            settings = load_settings({"ORCH_HOME": str(home)})
        except ConfigError as exc:
            self.problems.append(f"{block.where}: the settings do not load: {exc}")
            return
        raw = yaml.safe_load(block.text)
        for section, values in raw.items():
            for key in values:
                if not hasattr(getattr(settings, section), key):
                    self.problems.append(f"{block.where}: {section}.{key} was not read")

    def _iam_policy(self, block: Block) -> None:
        try:
            json.loads(block.text)
        except ValueError as exc:
            self.problems.append(f"{block.where}: not JSON: {exc}")

    def _covered_by(self, block: Block) -> None:
        for item in covered_by(block.arg):
            file, _, test = item.partition("::")
            target = REPO / file
            if not target.is_file():
                self.problems.append(f"{block.where}: covered-by {file}: no such file")
            elif test and not re.search(rf"^def {re.escape(test)}\(", target.read_text(), re.M):
                self.problems.append(f"{block.where}: covered-by {item}: no such test")

    def _run(self, block: Block) -> None:
        try:
            commands = run_commands(block)
        except ValueError as exc:
            self.problems.append(f"{block.where}: {exc}")
            return
        if not commands:
            self.problems.append(f"{block.where}: a run block without any orch command")
        for command in commands:
            self._run_one(block, command)

    def _run_one(self, block: Block, command: Command) -> None:
        args = [str(self.written[a]) if a in self.written else a for a in command.args]
        env = {"ORCH_HOME": str(self.home), **command.env}
        code, output = _orch(args, env, self.monkeypatch)
        where = f"{self.path.relative_to(REPO)}:{command.line} `{command.shown()}`"
        if code != command.exit_code:
            self.problems.append(
                f"{where}: exit code {code}, documented {command.exit_code}\n{output[-3000:]}"
            )
        for expected in command.expected:
            if not output_matches(expected, output):
                self.problems.append(f"{where}: no output line {expected!r} in:\n{output}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_of_the_page_runs_as_documented(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = Page(page, tmp_path, monkeypatch).check()
    assert not problems, "\n\n".join(problems)


def test_each_page_has_examples_and_the_index_lists_every_page() -> None:
    index = (REPO / "docs" / "README.md").read_text()
    for page in PAGES:
        if page.parent.name == "docs" and page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
    assert "](benchmarks.md)" in index and "](spot-deadlines.md)" in index
    kinds = {b.kind for page in PAGES for b in blocks(page)}
    assert kinds >= KINDS, f"no example of kind {KINDS - kinds}"


_LINK = re.compile(r"\]\((?P<target>[^)#\s]*)(?:#(?P<anchor>[^)\s]*))?\)")


def _anchors(page: Path) -> set[str]:
    """The fragments a page answers to: GitHub's heading slugs and explicit `<a id>`s."""
    text = page.read_text(encoding="utf-8")
    slugs = {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", text, re.M)
    }
    return slugs | set(re.findall(r'<a id="([^"]+)">', text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_pages_lead_somewhere(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    broken = []
    for m in _LINK.finditer(text):
        target, anchor = m.group("target"), m.group("anchor")
        if "://" in target:
            continue
        path = page.parent / target if target else page
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{page.name} links to missing files or headings: {broken}"


def test_a_wrong_exit_code_or_output_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checker itself fails on a page whose example does not do what it says."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: run -->\n```console\n$ orch status no-such-job\nerror: nothing\n```\n"
        "```yaml\nname: unmarked\n```\n\n    orch status\n"
    )
    monkeypatch.setattr("tests.support.doc_blocks.REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    problems = Page(page, tmp_path, monkeypatch).check()
    assert any("exit code 2, documented 0" in p for p in problems), problems
    assert any("no output line 'error: nothing'" in p for p in problems), problems
    assert any("a `yaml` block with no marker" in p for p in problems), problems
    assert any("unmarked orch command" in p for p in problems), problems


# --- docs/spot-deadlines.md: its examples, as that page writes them -------------------------


def test_the_spot_deadlines_page_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.spec.loading import load_job

    page = REPO / "docs" / "spot-deadlines.md"
    text = page.read_text(encoding="utf-8")
    fragments = [b for b in blocks(page) if b.lang == "yaml"]
    assert fragments, "spot-deadlines.md shows no spec fragment"
    env = {"ORCH_HOME": str(tmp_path / "orch")}
    for number, fragment in enumerate(fragments):
        spec = {"name": "deadline-job", "workdir": ".", "run": "python train.py"}
        spec.update(yaml.safe_load(fragment.text))
        path = tmp_path / f"fragment-{number}.yaml"
        path.write_text(yaml.safe_dump(spec))
        assert load_job(path).spec.deadline is not None
        code, out = _orch(["submit", str(path), "--dry-run", "--json"], env, monkeypatch)
        assert code == 0, out
    # The indented `orch ...` commands (with `\` continuations); `[...]` parts are optional.
    commands = re.findall(r"^ {4}orch (.+?(?:\\\n {4,}.+?)*)$", text, re.MULTILINE)
    assert commands, "spot-deadlines.md shows no orch command"
    for command in commands:
        line = re.sub(r"\s*\[[^\]]*\]", "", command.replace("\\\n", " "))
        code, out = _orch(line.split(), env, monkeypatch)
        assert code == 0, f"orch {line}: {out}"
