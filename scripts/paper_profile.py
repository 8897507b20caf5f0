"""Moved: `noisydml profile ...` (noisydml --help). Kept one release for scripts that call it."""

import sys

from noisydml.tools.console import main

if __name__ == "__main__":
    print("note: scripts/paper_profile.py is now `noisydml profile`", file=sys.stderr)
    sys.exit(main(["profile", *sys.argv[1:]]))
