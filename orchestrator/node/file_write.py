"""The one way orch writes a file on another machine (a node or the controller host): shell
text run over SSH whose stdin is the file's content, so the content never appears in a command
line (`ps`, logs, shell history).

The content goes to a new file beside the target that `mktemp` makes (a unique name, mode 0600,
O_EXCL: never an existing file or a symlink another process put there); it gets its mode only
once it is whole and is then renamed over the target. A reader sees the old file or the new
one, never a part; a secret is never readable by others, not even while it is written; a write
that fails removes its temporary file and exits non-zero. Pure text: nothing here does I/O.
"""

from __future__ import annotations

from orchestrator.node.launch import home_expr

PRIVATE = "0600"  # the mode of a file that may hold secrets (env values, credentials)


def write_file_command(path: str, mode: str = "0644") -> str:
    """Shell command writing stdin to `path` whole, with `mode` (octal text), creating its
    folder. `path` is home-relative, or absolute when it starts with `/`."""
    quoted = home_expr(path)
    return (
        f'f={quoted}; mkdir -p "$(dirname "$f")" && t=$(mktemp "$f.XXXXXXXX") && '
        f'{{ cat > "$t" && chmod {mode} "$t" && mv -f "$t" "$f" || {{ rm -f "$t"; false; }}; }}'
    )
