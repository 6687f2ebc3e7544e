"""The entry of the node runtime (`orchestrator.node.runtime`): the `__main__.py` of its zipapp.

    python3 orch-node-<version>.pyz PROGRAM [ARGUMENTS...]

runs one node program with its own arguments, as if its file were run (`guard TERMS_JSON`,
`checkpoint-agent watch --config config.json`, `checkpoint-agent restore`, ...). Standard
library only, Python 3.8 or newer; the program's modules are at the top of the zipapp.
"""

import runpy
import sys

# program name -> its module at the top of the zipapp
PROGRAMS = {
    "guard": "guard",
    "checkpoint-agent": "checkpoint_agent",
    "set-aside": "set_aside",
    "clear-files": "clear_files",
    "imds": "imds_server",
    "bucket-data": "bucket_data",
    "allocation-end": "allocation_end",
}


def main(argv):
    if len(argv) < 2 or argv[1] not in PROGRAMS:
        names = "|".join(sorted(PROGRAMS))
        print(f"usage: {argv[0] if argv else 'orch-node'} {names} [ARGUMENTS...]", file=sys.stderr)
        return 2
    module = PROGRAMS[argv[1]]
    sys.argv = [f"{module}.py", *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
