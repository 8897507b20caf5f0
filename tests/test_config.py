import copy
import re

import pytest

from conftest import REPO
from noisydml.config import ParamsError, load_params
from noisydml.tools.check import validate_all as validate_params


@pytest.mark.parametrize("anchor, method_set", [("default_methods", "default"), ("all_baselines", "all_baselines"),
                                                 ("noise_robust", "noise_robust")])
def test_grid_methods_can_point_at_every_method_set(tmp_path, anchor, method_set):
    text = (REPO / "params.yaml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("  methods: *"))
    text = text.replace(line, f"  methods: *{anchor}")
    if anchor != "default_methods":  # the default chain's upstream (prism) is not in these sets
        text = text[: text.index("chains:\n")] + "chains: {}\n\ntracking:" + text.split("\ntracking:", 1)[1]
    if anchor == "all_baselines":  # no bspml run to draw the default MAW/SDAW map from
        text = text.replace("    glyphs_sym50: {dataset: glyphs, noise: sym50, seed: 0, method: bspml, lambdas: [2.7, 3.1, 3.5],\n"
                            "                   mus: [0.0, 3.5, 20.0], passes: 36}\n", "    {}\n")
    (tmp_path / "params.yaml").write_text(text)
    p = load_params(tmp_path / "params.yaml")
    assert p["grid"]["methods"] == p["method_sets"][method_set]


def test_repository_params_are_valid():
    p = load_params("params.yaml")
    assert p["grid"]["methods"] == ["ms", "contrastive", "mcl", "proxy_anchor", "prism", "ms_rho1", "bspml", "sgps",
                                   "spa_confidence", "proxy_anchor_frozen"]
    assert p["timing"]["entries"] == {}  # opt-in
    assert set(p["method_sets"]["all_baselines"]) >= {"ms", "softtriple", "circle", "supcon", "fastap"}
    # defaults are filled in
    assert p["methods"]["proxy_anchor"]["lr_multiplier"] == 100.0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r["grid"].update(methods=["ms", "nope"]), "grid.methods[1]: unknown method 'nope'"),
        (lambda r: r["timing"].update(noise="sc75"), "timing.noise: unknown noise setting 'sc75'"),
        (lambda r: r["timing"]["entries"].update(x={"label": "x", "method": "prism", "hparams": {"window": 0}}),
         "timing.entries.x.hparams.window: 0 is below the minimum 1"),
        (lambda r: r["timing"]["entries"].update(a={"label": "MCL", "method": "mcl"}, b={"label": "MCL", "method": "ms"}),
         "'MCL' is listed twice"),
        (lambda r: r["timing"]["entries"].update(x={"label": "x", "method": "nope"}),
         "timing.entries.x.method: unknown method 'nope'"),
        (lambda r: r.pop("runtime"), "missing required section 'runtime'"),
        (lambda r: r["chains"]["ms_on_prism_kept"].update(upstream="triplet"),
         "chains.ms_on_prism_kept.upstream: unknown upstream 'triplet'"),
        (lambda r: r["chains"]["ms_on_prism_kept"].update(name="ms"), "'ms' is a method's name"),
        (lambda r: r["chains"]["ms_on_prism_kept"].update(noise="sym20"), "chains.ms_on_prism_kept.noise: 'sym20' is not in grid.noises"),
        (lambda r: r["chains"]["ms_on_prism_kept"].update(labels={"label": "", "keep": ""}), "takes nothing from its upstream"),
        (lambda r: r["chains"]["ms_on_prism_kept"].update(seeds=[7]), "chains.ms_on_prism_kept.seeds: [7] not in grid.seeds"),
        (lambda r: r["chains"]["ms_on_prism_kept"].update(seeds="all"),
         "chains.ms_on_prism_kept.seeds: 'all' is not allowed; allowed values: grid (every seed of grid.seeds)"),
        (lambda r: r["chains"].update(again={**r["chains"]["ms_on_prism_kept"]}), "the same dataset, noise and name"),
        (lambda r: r["chains"].update(a={**r["chains"]["ms_on_prism_kept"], "name": "a", "upstream": "b"},
                                      b={**r["chains"]["ms_on_prism_kept"], "name": "b", "upstream": "a"}),
         "leads back to itself"),
        (lambda r: r["runtime"].update(device="tpu"), "runtime.device: 'tpu' is not allowed"),
        (lambda r: r["train"].update(backbone="vgg"), "train.backbone: unknown backbone 'vgg'"),
        (lambda r: r["methods"]["prism"].update(noise_rate=1.0), "methods.prism.noise_rate: 1.0 is above the maximum 0.99"),
        (lambda r: r["noise"]["sym50"].update(rate=1.5), "noise.sym50.rate: 1.5 is above the maximum 1.0"),
        (lambda r: r["noise"]["sym50"].update(rate=-0.1), "noise.sym50.rate: -0.1 is below the minimum 0.0"),
        (lambda r: r["grid"].update(datasets=["cub2010"]),
         "grid.datasets[0]: unknown dataset 'cub2010'; allowed: cars, cars98n, clothing, cnwl_cars, cub, faces, faces_clean, faces_large, faces_large_clean, food, glyphs, inshop, motifs, motifs_hard, sop"),
        (lambda r: r["grid"].update(noises=["clean", "sym90"]), "unknown noise setting 'sym90'"),
        (lambda r: r["noise"].update(bad={"kind": "pairflip", "rate": 0.2}), "noise.bad.kind: unknown noise kind 'pairflip'"),
        (lambda r: r["train"]["batch"].update(classes=500), "train.batch.classes: 500 classes per batch, but dataset 'glyphs' has only 200"),
        (lambda r: r["train"].update(epochz=3), "train: unknown key 'epochz'"),
        (lambda r: r["methods"]["ms"]["loss"].update(alpah=2), "methods.ms.loss: unknown key 'alpah'"),
        (lambda r: r["methods"].update(foo={}), "methods: unknown method 'foo'"),
        (lambda r: r["train"]["optimizer"].update(name="rmsprop"), "train.optimizer.name: 'rmsprop' is not allowed"),
        (lambda r: r["train"].update(epochs="ten"), "train.epochs: expected int, got 'ten'"),
        (lambda r: r["grid"].update(methods=["ms", "ms"]), "grid.methods: 'ms' is listed twice"),
        (lambda r: r.update(extra=1), "unknown top-level key 'extra'"),
        (lambda r: r["datasets"].update({"bad-name": {"kind": "glyphs"}}), "is not a valid name"),
        (lambda r: r["datasets"].update(mine={"kind": "folder", "image_size": 32}), "give exactly one of 'root'"),
        (lambda r: r["datasets"]["glyphs"].update(num_classes=1000), "datasets.glyphs.num_classes: 1000 is above the maximum"),
        (lambda r: r["report"].update(metrics=["precision_at_5"]), "report.metrics[0]: unknown metric 'precision_at_5'"),
    ],
)
def test_mistakes_name_key_and_value(raw_params, mutate, message):
    mutate(raw_params)
    with pytest.raises(ParamsError) as err:
        validate_params(raw_params)
    assert message in str(err.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ParamsError, match="no such file"):
        load_params(tmp_path / "params.yaml")


def test_a_figure_must_draw_from_a_run_of_the_grid():
    import yaml

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    entry = raw["figures"]["bspml_maps"]["glyphs_sym50"]
    assert validate_params(raw)["figures"]["bspml_maps"]["glyphs_sym50"]["method"] == "bspml"
    for change, message in [
        ({"seed": 7}, "figures.bspml_maps.glyphs_sym50.seed: 7 is not a seed of the grid"),
        ({"noise": "sc75"}, "figures.bspml_maps.glyphs_sym50.noise: unknown noise setting the grid trains on 'sc75'"),
        ({"mus": []}, "figures.bspml_maps.glyphs_sym50.mus: must list at least one value"),
        ({"method": "ms"}, "figures.bspml_maps.glyphs_sym50.method: 'ms' is not allowed"),
    ]:
        bad = copy.deepcopy(raw)
        bad["figures"]["bspml_maps"]["glyphs_sym50"] = {**entry, **change}
        with pytest.raises(ParamsError, match=re.escape(message)):
            validate_params(bad)
    raw["grid"]["methods"] = ["ms", "prism"]
    raw["chains"] = {}  # the default chains need sgps in the grid
    with pytest.raises(ParamsError, match=re.escape("figures.bspml_maps.glyphs_sym50.method: 'bspml' is not a "
                                                    "method of grid.methods")):
        validate_params(raw)


def test_embedding_size_points_are_runs_and_their_settings_are_checked():
    import yaml

    from noisydml.studies import all_runs as runs_of  # the grid's, the chains' and the studies' own runs

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    assert validate_params(raw)["figures"]["embedding_size"]["dims"] == []  # opt-in: no runs by default
    assert not [r for r in runs_of(validate_params(copy.deepcopy(raw))) if r.kind.name == "embedding_size"]
    on = copy.deepcopy(raw)
    on["grid"]["noises"] = [*raw["grid"]["noises"], "sympc20"]
    on["figures"]["embedding_size"].update(dims=[16, 32], seeds=[0, 1])
    points = [r for r in runs_of(validate_params(on)) if r.kind.name == "embedding_size"]
    assert len(points) == 3 * 2 * 2
    point = next(r for r in points if r.folder == "runs/glyphs/sympc20/bspml_dim16/seed1")
    assert (point.method, point.train, point.point, point.stage) == (
        "bspml", {"embedding_dim": 16}, {"embedding_dim": 16}, "train_embedding_size@bspml-16-1")
    for change, message in [
        ({"dims": [16]}, "figures.embedding_size.noise: 'sympc20' is not a noise setting the grid trains on"),
        ({"methods": ["nope"]}, "figures.embedding_size.methods[0]: unknown method 'nope'"),
        ({"dims": [0]}, "figures.embedding_size.dims[0]: 0 is below the minimum 1"),
        ({"dataset": "cub", "dims": [16]}, "figures.embedding_size.dataset: unknown dataset of grid.datasets 'cub'"),
    ]:
        bad = copy.deepcopy(raw)
        bad["figures"]["embedding_size"].update(change)
        with pytest.raises(ParamsError, match=re.escape(message)):
            validate_params(bad)
    twice = copy.deepcopy(on)
    twice["figures"]["embedding_size"]["dims"] = [16, 16]
    with pytest.raises(ParamsError, match=re.escape("figures.embedding_size.dims: 16 is listed twice")):
        validate_params(twice)
    clash = copy.deepcopy(on)
    clash["chains"]["ms_on_prism_kept"].update(name="ms_dim16", noise="sympc20")
    clash["figures"]["embedding_size"]["methods"] = ["ms"]
    with pytest.raises(ParamsError, match=re.escape("train_embedding_size@ms-16-0 and train_chain@ms_on_prism_kept "
                                                    "would both write runs/glyphs/sympc20/ms_dim16/seed0")):
        validate_params(clash)


def test_bspml_cells_are_runs_named_as_dvc_writes_their_values():
    import yaml

    from noisydml.studies import all_runs as runs_of  # the grid's, the chains' and the studies' own runs

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    assert validate_params(copy.deepcopy(raw))["figures"]["bspml_cells"]["lambdas"] == []  # opt-in
    on = copy.deepcopy(raw)
    on["grid"]["noises"] = [*raw["grid"]["noises"], "sympc20"]
    on["figures"]["bspml_cells"].update(lambdas=[2.7, 3.0], mus=[0.0, 20], seeds=[0])
    cells = sorted(r.name for r in runs_of(validate_params(on)) if r.kind.name == "bspml_cell")
    # the names keep the values as YAML wrote them (DVC's stage paths do the same): 20 stays "20", 3.0 "3.0"
    assert cells == ["bspml_lam2.7_mu0.0", "bspml_lam2.7_mu20", "bspml_lam3.0_mu0.0", "bspml_lam3.0_mu20"]
    for change, message in [
        ({"mus": []}, "figures.bspml_cells: needs at least one lambda, one mu and one seed"),
        ({"lambdas": [0.0]}, "figures.bspml_cells.lambdas: 0 is not allowed"),
        ({"lambdas": [3.0, 3.0]}, "figures.bspml_cells.lambdas: 3.0 is listed twice"),
        ({"noise": "sympc30"}, "figures.bspml_cells.noise: 'sympc30' is not a noise setting the grid trains on"),
    ]:
        bad = copy.deepcopy(on)
        bad["figures"]["bspml_cells"].update(change)
        with pytest.raises(ParamsError, match=re.escape(message)):
            validate_params(bad)


def test_the_train_stage_names_its_run_by_folder_and_refuses_one_params_does_not_have():
    import argparse

    from noisydml.cli import add_train_arguments
    from noisydml.pipeline.train import run_from_arguments

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    params = load_params(REPO / "params.yaml")
    for argv, message in [
        (["--run-folder", "runs/glyphs/sympc20/ms/seed0"], "--run-folder 'runs/glyphs/sympc20/ms/seed0' is not a run of params.yaml"),
        (["--run-folder", "runs/glyphs/sym50/bspml_lam3.1_mu0.0/seed0"], "is not a run of params.yaml"),
    ]:
        with pytest.raises(ParamsError, match=re.escape(message)):
            run_from_arguments(params, parser.parse_args(argv))
    with pytest.raises(SystemExit):  # --run-folder is required
        parser.parse_args([])


def test_weights_sha256_is_a_sum_or_a_publishers_prefix():
    from noisydml.schema import check_sha256

    assert check_sha256("52DEB4733", "w", min_digits=8) == "52deb4733"
    with pytest.raises(ParamsError, match=r"weights.x.sha256: '52de' is not a sha256 or a prefix of one; "
                                          r"allowed: 8 to 64 hex digits"):
        check_sha256("52de", "weights.x.sha256", min_digits=8)
    with pytest.raises(ParamsError, match=r"l.sha256: 'zz' is not a sha256; allowed: 64 hex digits"):
        check_sha256("zz", "l.sha256")


def test_a_key_named_like_the_models_internal_fields_is_reported_under_its_own_name():
    """Sections are pydantic models whose fields are aliases of positional names (f0, f1, ...): an error is
    reported at the params key itself, even a key that looks like one of those names."""
    from noisydml.schema import Field, check_section

    with pytest.raises(ParamsError, match=re.escape("s.f0: expected int, got 'y' (str)")):
        check_section({"a": 1, "f0": "y"}, {"a": Field(int), "f0": Field(int, 1)}, "s")
