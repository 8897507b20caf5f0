"""DVC stage: what the code of each stage script, method, study and dataset means (the package files it runs, each
with the digest of its syntax tree without comments or docstrings) -> code/stages/, code/methods/, code/studies/,
code/datasets/, code/training/, the only code every other stage depends on (dvc.yaml). Trains nothing."""

from noisydml.cli import run_stage

#: The params sections this stage loads: datasets (each dataset's kind names its unit; and runtime, as every stage)
SECTIONS = ("datasets",)


def _load():
    from noisydml.pipeline.code_digests import write_code_digests

    def work(params, args):
        counts = write_code_digests(datasets={name: body["kind"] for name, body in params["datasets"].items()})
        print("code_digests: " + ", ".join(f"{n} {kind} -> code/{kind}/" for kind, n in counts.items()))

    return work


if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, _load, SECTIONS)
