"""params.yaml's JSON Schema (from the pydantic models the loader validates with; ``python -m
noisydml.tools.params_schema`` writes it to params.schema.json for an editor): a valid JSON Schema, accepted by
params.yaml, refusing what the loader refuses, and every declared key written in params.yaml."""

import json

import jsonschema
import pytest

from noisydml.config import read_params_file
from noisydml.tools.params_schema import SCHEMA_FILE, params_json_schema, write_schema

from conftest import REPO


@pytest.fixture(scope="module")
def schema():
    return params_json_schema()


def test_the_schema_is_written_where_params_yaml_names_it(schema, tmp_path):
    jsonschema.Draft202012Validator.check_schema(schema)
    written = write_schema(tmp_path / SCHEMA_FILE)
    assert json.loads(written.read_text()) == schema
    assert (REPO / "params.yaml").read_text().startswith(f"# yaml-language-server: $schema={SCHEMA_FILE}\n")


def _errors(schema, params):
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft202012Validator(schema).iter_errors(params)]


@pytest.mark.parametrize("edit, where", [
    (lambda p: p["train"]["optimizer"].update(lr="3e-05"), "train.optimizer.lr"),  # what YAML 1.1 reads
    (lambda p: p["noise"]["sym50"].update(rate=1.5), "noise.sym50"),
    (lambda p: p["methods"]["prism"].update(noise_rate=True), "methods.prism.noise_rate"),
    (lambda p: p["chains"]["ms_on_prism_kept"].update(seeds="all"), "chains.ms_on_prism_kept.seeds"),
    (lambda p: p["runtime"].update(device="tpu"), "runtime.device"),
    (lambda p: p["grid"].update(sedes=[0]), "grid"),
])
def test_params_yaml_is_valid_and_a_wrong_value_is_marked_where_it_is(schema, edit, where):
    params = read_params_file(REPO / "params.yaml")
    assert _errors(schema, params) == []
    edit(params)
    errors = _errors(schema, params)
    assert errors and all(e.startswith(where) for e in errors), errors


#: Sections whose keys are partial by design: a chain's own overrides of methods.<method> and of train.
PARTIAL = ("hparams", "train")


def test_every_declared_key_is_written_in_params_yaml(schema):
    """No hidden defaults: every key a section declares is written out in params.yaml (except within a chain's
    partial overrides, and the pixel keys of noise features clustered on a run, which that source refuses)."""
    missing = []

    def walk(section_schema, value, path):
        if not isinstance(value, dict):
            return
        if "oneOf" in section_schema:  # a kinded entry: the schema of its kind
            chosen = [o for o in section_schema["oneOf"] if o["properties"]["kind"]["const"] == value.get("kind")]
            return walk(chosen[0], value, path) if chosen else None
        properties = section_schema.get("properties", {})
        for key, sub in properties.items():
            if key in value:
                walk(sub, value[key], [*path, key])
            elif not (path[:1] == ["chains"] and len(path) == 3 and path[2] in PARTIAL) and not (
                    path[-1:] == ["features"] and value.get("source") == "run"):
                missing.append(".".join([*path, key]))
        entries = section_schema.get("additionalProperties")
        if isinstance(entries, dict):
            for key, sub in value.items():
                if key not in properties:
                    walk(entries, sub, [*path, key])

    walk(schema, read_params_file(REPO / "params.yaml"), [])
    assert missing == []
