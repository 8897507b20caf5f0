"""DVC stage: tables, plots and combined metrics of the whole grid (reports/)."""

from noisydml.cli import run_stage
from noisydml.pipeline import report


def main() -> None:
    run_stage(__doc__, lambda p: None, lambda params, a: report(params))


if __name__ == "__main__":
    main()
