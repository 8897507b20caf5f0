"""The paper profiles: list them, check them through DVC's own override code, print their settings tables, print
or run one's `dvc exp run` command.

    python scripts/paper_profile.py list                # runs, iterations, estimated GPU hours
    python scripts/paper_profile.py check
    python scripts/paper_profile.py settings            # the settings tables of docs/profiles.md (--write: update it)
    python scripts/paper_profile.py lr [PNG]            # every profile's learning-rate curve (docs/profiles_lr.png)
    python scripts/paper_profile.py show prism/table1_cub
    python scripts/paper_profile.py run prism/table1_cub     # on a GPU machine with internet
    python scripts/paper_profile.py rehearse prism/table3_cars98n [FOLDER]   # real DVC, miniature data, CPU
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from noisydml.pipeline.profiles import (PROFILES_PAGE, exp_command, load_profiles, lr_curves, params_after,
                                        profiles_table, readme_with_settings, settings_tables)


def main(argv: list[str]) -> int:
    action, *rest = argv or ["list"]
    if action in ("-h", "--help"):
        print(__doc__)
        return 0
    profiles = load_profiles()
    if action in ("rehearse", "show", "run") and rest and rest[0] not in profiles:
        print(f"error: profile {rest[0]!r} does not exist; allowed: {', '.join(profiles)}", file=sys.stderr)
        return 2
    if action == "list":  # with the GPU-hour estimate of noisydml.pipeline.profiles.estimate (its assumptions)
        print(profiles_table(profiles))
        return 0
    if action == "check":
        for name, p in profiles.items():  # through DVC's own override code, as `dvc exp run -S` applies them
            params_after(p["set"])
            print(f"{name}: valid")
        return 0
    if action == "settings":
        text = profiles_table(profiles) + "\n" + settings_tables(profiles)
        if rest == ["--write"]:
            page = Path(PROFILES_PAGE)
            page.write_text(readme_with_settings(page.read_text(), text))
            print(f"{page}: profile and settings tables written")
        else:
            print(text)
        return 0
    if action == "lr":
        applied = {name: params_after(p["set"]) for name, p in profiles.items()}
        print(f"{lr_curves(profiles, applied, rest[0] if rest else 'docs/profiles_lr.png')}: written")
        return 0
    if action == "rehearse" and rest:
        from noisydml.pipeline.rehearsal import rehearse

        folder = rehearse(rest[0], profiles[rest[0]], folder=rest[1] if len(rest) > 1 else None)
        print(f"{rest[0]}: rehearsed in {folder} (report: {folder / 'reports' / 'results.md'})")
        return 0
    if action in ("show", "run") and rest:
        command = exp_command(rest[0], profiles[rest[0]])
        print(command)
        return subprocess.call(command.replace("\\\n", " "), shell=True) if action == "run" else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
