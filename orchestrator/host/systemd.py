"""The controller-host daemon as a systemd unit, on hosts booted with systemd (AWS images).

Pure: text only. The unit runs the daemon as the login user with the host's environment file,
restarts it whenever it exits (`Restart=always`), and does not start it while the stop flag
exists (`ExecCondition`): autostop and `orch controller down` leave the flag, so a daemon that
stopped on purpose stays stopped (a skipped condition is no failure, and is not restarted).
Hosts without systemd (local and sandbox hosts) keep the shell supervisor (`supervisor_script`).
"""

from __future__ import annotations

import shlex

from orchestrator.errors import ControllerHostError
from orchestrator.host.layout import DAEMON_MODULE, UNIT_NAME, UNIT_PATH, HostLayout, as_root

# Prints `systemd` where systemctl exists and PID 1 is systemd's manager, else `supervisor`.
DETECT = (
    'if command -v systemctl >/dev/null 2>&1 && [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]'
    " && systemctl show-environment >/dev/null 2>&1; then echo systemd; else echo supervisor; fi"
)


def _unit_safe(path: str) -> str:
    if any(c.isspace() or c in "\"'\\%$;" for c in path):
        raise ControllerHostError(
            f"orch's folder on the host ({path}) has a character a systemd unit cannot carry",
            hint="log into the host as a user whose home path is plain",
        )
    return path


def unit_text(layout: HostLayout, user: str) -> str:
    """The unit file of the daemon of `layout`, run as `user`."""
    root = _unit_safe(layout.root)
    script = (
        f". {root}/env && exec {root}/venv/bin/python -m {DAEMON_MODULE} --root {root} "
        f">> {root}/daemon.log 2>&1"
    )
    return "\n".join(
        [
            "[Unit]",
            "Description=orch controller-host daemon",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            "Type=simple",
            f"User={_unit_safe(user)}",
            f"WorkingDirectory={root}",
            "UMask=0077",
            f"ExecCondition=/bin/sh -c '! test -e {root}/stop'",
            f"ExecStart=/bin/sh -c '{script}'",
            "Restart=always",
            "RestartSec=2",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def install_command(layout: HostLayout) -> str:
    """Shell text that installs the unit read from stdin, clears the stop flag and starts it."""
    q = shlex.quote
    return (
        f"{as_root(f'tee {UNIT_PATH} >/dev/null')} && "
        f"rm -f {q(layout.stop_flag)} && "
        f"{as_root('systemctl daemon-reload')} && "
        f"{as_root(f'systemctl enable --now {UNIT_NAME}')} >/dev/null 2>&1 && "
        f"{as_root(f'systemctl restart {UNIT_NAME}')} && echo started"
    )
