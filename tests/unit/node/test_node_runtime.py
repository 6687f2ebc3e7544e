"""The node runtime's zipapp: reproducible, standard library only, small files, every program
runnable from it alone."""

from __future__ import annotations

import ast
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from orchestrator.node import runtime, runtime_main

NODE = Path(runtime.__file__).parent
# Imported by the checkpoint agent for an `s3://` store only, inside the function that opens it.
ONLY_WHEN_ASKED = {"boto3", "botocore"}
MAX_LINES = 600


def entries() -> dict[str, str]:
    with zipfile.ZipFile(io.BytesIO(runtime.build())) as archive:
        return {name: archive.read(name).decode() for name in archive.namelist()}


def test_the_same_sources_give_the_same_bytes_in_another_process() -> None:
    script = (
        "import hashlib; from orchestrator.node import runtime; "
        "print(hashlib.sha256(runtime.build()).hexdigest(), runtime.file_name())"
    )
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    here = f"{hashlib.sha256(runtime.build()).hexdigest()} {runtime.file_name()}\n"
    assert runs[0].stdout == runs[1].stdout == here
    assert runtime.file_name() == f"orch-node-{runtime.digest()[:16]}.pyz"
    with zipfile.ZipFile(io.BytesIO(runtime.build())) as archive:
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_the_version_follows_the_sources() -> None:
    files = entries()
    assert files == runtime.sources()
    assert list(files)[0] == "__main__.py"
    for program in runtime_main.PROGRAMS.values():
        assert f"{program}.py" in files


def imported(tree: ast.Module) -> list[tuple[str, bool]]:
    """(top-level name, whether at module level or under a module-level `if`) of every import."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, top))
            inner = top and isinstance(child, (ast.If, ast.Try, ast.With))
            visit(child, inner)

    visit(tree, True)
    return found


def test_every_module_of_the_runtime_imports_the_standard_library_or_its_own() -> None:
    """The import fence: a node has nothing of orch installed and perhaps nothing but Python."""
    files = entries()
    own = {name.removesuffix(".py") for name in files}
    for name, text in files.items():
        for module, top in imported(ast.parse(text)):
            root = module.split(".")[0]
            if module.startswith("orchestrator.node."):  # the same module, when run in orch
                assert module.removeprefix("orchestrator.node.") in own, (name, module)
            elif root in ONLY_WHEN_ASKED:
                assert not top, f"{name} imports {module} at its top"
            else:
                assert root in own or root in sys.stdlib_module_names, (name, module)


def test_no_node_program_file_is_longer_than_600_lines() -> None:
    for name in (*runtime.MODULES, "runtime_main.py"):
        lines = len((NODE / name).read_text().splitlines())
        assert lines <= MAX_LINES, f"{name}: {lines} lines"


def test_every_program_runs_from_the_zipapp_alone(tmp_path: Path) -> None:
    """No site-packages (-I -S: not even the interpreter's), no orch: each program starts."""
    zipapp = tmp_path / runtime.file_name()
    zipapp.write_bytes(runtime.build())

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-I", "-S", str(zipapp), *argv]
        env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=30)

    assert run("checkpoint-agent", "--help").returncode == 0
    assert run("imds", "--help").returncode == 0
    assert "usage:" in run("set-aside").stderr
    assert run("guard", str(tmp_path / "none.json")).returncode != 0
    (tmp_path / "orch-jobs/x/run").mkdir(parents=True)
    cleared = run("clear-files", '{"root": "orch-jobs/x", "remove": ["orch-jobs/x/run"]}')
    assert cleared.stdout == '{"removed":0,"dir":"none"}\n', cleared.stderr
    assert not (tmp_path / "orch-jobs/x/run").exists()
    status = subprocess.run(
        [sys.executable, "-I", "-S", str(zipapp), "bucket-data", "status"], capture_output=True,
        text=True, timeout=30, input=f'{{"url": "s3://b/p", "dst": "{tmp_path}/data"}}',
    )  # fmt: skip
    assert status.stdout == '{"status":{"complete":false,"objects":0,"bytes":0}}\n', status.stderr
    unknown = run("rm")
    assert unknown.returncode == 2 and "checkpoint-agent" in unknown.stderr


def test_the_install_checks_the_bytes_before_it_puts_them_in_place(tmp_path: Path) -> None:
    def install(stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", runtime.install_command()], input=stdin, capture_output=True,
            text=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    placed = tmp_path / runtime.node_path()
    damaged = runtime.install_input()[:-8] + "AAAAAAA="
    assert install(damaged).returncode != 0
    assert not placed.exists()
    check = ["bash", "-c", runtime.check_command()]
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert not runtime.has_runtime(
        subprocess.run(check, capture_output=True, text=True, env=env).stdout
    )
    assert install(runtime.install_input()).returncode == 0
    assert placed.read_bytes() == runtime.build()
    assert runtime.has_runtime(
        subprocess.run(check, capture_output=True, text=True, env=env).stdout
    )
    assert sorted(p.name for p in placed.parent.iterdir()) == [runtime.file_name()]
