"""DVC stage: tables, plots and combined metrics of the whole grid (reports/)."""

from noisydml.cli import run_stage
from noisydml.pipeline.report import report

if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, lambda params, args: report(params))
