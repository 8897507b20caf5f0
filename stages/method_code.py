"""DVC stage: each method's code (its module and the package files it imports, with their digests) ->
code/methods/<method>.json, which every stage training that method depends on (dvc.yaml). Trains nothing."""

from noisydml.cli import run_stage

#: The params sections this stage loads: none (but runtime, as every stage; noisydml.cli)
SECTIONS = ()


def _load():
    from noisydml.pipeline.method_code import write_method_code

    def work(params, args):
        names = write_method_code()
        print(f"method_code: {len(names)} methods -> code/methods/")

    return work


if __name__ == "__main__":
    run_stage(__doc__, lambda parser: None, _load, SECTIONS)
