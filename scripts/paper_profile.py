"""The paper profiles: list them, check them against params.yaml, print or run one's `dvc exp run` command.

    python scripts/paper_profile.py list
    python scripts/paper_profile.py check
    python scripts/paper_profile.py show prism/table1_cub
    python scripts/paper_profile.py run prism/table1_cub     # on a GPU machine with internet
"""

from __future__ import annotations

import subprocess
import sys

from noisydml.pipeline.profiles import exp_command, load_profiles, params_after


def main(argv: list[str]) -> int:
    action, *rest = argv or ["list"]
    profiles = load_profiles()
    if action == "list":
        for name, p in profiles.items():
            hours = p["runs"] * p["gpu_hours_per_run"]
            print(f"{name:28s} {p['table']}: {p['runs']} runs x ~{p['gpu_hours_per_run']} GPU h = ~{hours:.0f} GPU h")
        return 0
    if action == "check":
        for name, p in profiles.items():  # through DVC's own override code, as `dvc exp run -S` applies them
            params_after(p["set"])
            print(f"{name}: valid")
        return 0
    if action in ("show", "run") and rest:
        command = exp_command(rest[0], profiles[rest[0]])
        print(command)
        return subprocess.call(command.replace("\\\n", " "), shell=True) if action == "run" else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
