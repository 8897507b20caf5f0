"""DVC stage: what the code of each stage script, method and study means (the package files it runs, each with the
digest of its syntax tree without comments or docstrings) -> code/stages/, code/methods/, code/studies/, the only
code every other stage depends on (dvc.yaml). Trains nothing."""

from noisydml.cli import run_stage

#: The params sections this stage loads: none (but runtime, as every stage; noisydml.cli)
SECTIONS = ()


def _load():
    from noisydml.pipeline.code_digests import write_code_digests

    def work(params, args):
        counts = write_code_digests()
        print("code_digests: " + ", ".join(f"{n} {kind} -> code/{kind}/" for kind, n in counts.items()))

    return work


if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, _load, SECTIONS)
