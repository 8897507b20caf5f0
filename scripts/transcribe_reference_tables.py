"""Write references/papers/*.csv: every table of the PRISM, SGPS and BSPML papers, one row per cell.

The source is the transcriptions in the papers folder beside the repository (``../shared/papers``:
``prism-tables.md``, ``sgps-spec.md``, ``bspml-spec.md``; each checked against the papers' text by its author).
This script parses their markdown tables, so the numbers in the CSV files are exactly the transcribed ones;
re-run it when a transcription is corrected:

    python scripts/transcribe_reference_tables.py ../shared/papers references/papers

Columns: ``paper, table, caption, row, method, dataset, noise, rate, metric, value, std, comparable, note,
footnote, settings_of``:
``method`` is our method (or chained run) the row corresponds to ("" = not implemented here); ``noise`` is
clean | real | symmetric | small_cluster | symmetric_per_class (or "" where the table has none); ``rate`` in
[0, 1]; ``value`` and ``std`` in % as printed; ``comparable`` is "no" for rows whose number is not what the row
name says (``note`` says why); ``footnote`` is "yes" for a comparable row the report marks with ‡ and explains
under its table (its ``note``), e.g. SGPS Table I's SGPS-MCL row, which its caption says is the posterior strategy;
``settings_of`` is the paper whose number the cell holds, so whose settings a run must be trained under to fill it
(the report's rule): the cell's own paper, except SGPS cells that reprint PRISM's (:func:`reprinted_from_prism`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

DATASETS = {"CARS": "cars196", "Car": "cars196", "Cars": "cars196", "SOP": "sop", "CUB": "cub200",
            "CARS-98N": "cars98n", "Food-101N": "food101n", "Clothing1M": "clothing1m", "In-shop": "inshop"}
METRICS = {"P@1": "precision_at_1", "MAP@R": "mean_average_precision_at_r", "NMI": "nmi"}

#: paper row name (citations and bold removed) -> our method or chained run
PRISM_METHODS = {"FastAP": "fastap", "nSoftmax": "normalized_softmax", "ProxyNCA": "proxynca",
                 "Soft Triple": "softtriple", "Soft Triple + PRISM (Ours)": "softtriple_prism", "MS": "ms",
                 "Circle": "circle", "Contrastive Loss": "contrastive", "Contrastive": "contrastive",
                 "Memory Contrastive Loss (MCL)": "mcl", "MCL + PRISM (Ours)": "prism",
                 "Co-teaching": "coteaching", "Co-teaching+": "coteaching_plus",
                 "Co-teaching w/ Temperature": "coteaching_t", "F-correction": "f_correction"}
SGPS_METHODS = {"FastAP": "fastap", "nSoftmax": "normalized_softmax", "ProxyNCA": "proxynca",
                "Soft Triple": "softtriple", "MS": "ms", "Circle": "circle", "Contrastive": "contrastive",
                "XBM-MCL": "mcl", "PRISM-MCL": "prism", "Supcon": "supcon", "SupCon": "supcon",
                "SGPS-MCL": "sgps", "SGPS-MCL (posterior strategy per caption)": "sgps_posterior",
                "SGPS-SupCon": "sgps_supcon", "Co-teaching": "coteaching", "Co-teaching+": "coteaching_plus",
                "Co-teaching w/ T": "coteaching_t", "F-correction": "f_correction", "UNICON": "unicon",
                "DivideMix": "dividemix", "LRA-Diffusion": "lra_diffusion", "LabelWave": "labelwave",
                "Roadmap": "roadmap", "Contextual": "contextual", "SGPS-Roadmap": "sgps_roadmap",
                "SGPS-Contextual": "sgps_contextual"}
#: SGPS Table IV (face recognition): row -> our method; the verification columns -> our metrics (IJB-B's and IJB-C's
#: TAR@FAR are one IJB set's metrics, named by the set a dataset reads: ``ijb_name``)
FACE_METHODS = {"ArcFace": "arcface", "CosFace": "cosface", "Subcenter": "subcenter_arcface", "SKH": "skh",
                "DCQ": "dcq", "DCQ + SKH": "dcq_skh", "DCQ + SGPS (Ours)": "dcq_sgps"}
FACE_METRICS = {"LFW": "lfw_accuracy", "CFP-FP": "cfp_fp_accuracy", "AgeDB-30": "agedb_30_accuracy",
                **{f"IJB-{s} {far}": f"ijb{s.lower()}_tar_at_far_{value}" for s in "BC"
                   for far, value in (("1e-3", "0.001"), ("1e-4", "0.0001"), ("1e-5", "1e-05"))}}
#: Why a Table IV row has no method here (said under the table)
FACE_NOT_IMPLEMENTED = {
    "NT": "not implemented: its public code is Caffe (huangyangyu/NoiseFace) and its three-stage weighting by the "
          "distribution of the samples' angles is not built here yet",
    "NR": "not implemented: its public code is MXNet under Python 2 (Unequal-Training-for-Deep-Face-Recognition-"
          "with-Long-Tailed-Noisy-Data) and it is not built here yet",
    "Co-mining": "not implemented: no public code was found, and the paper leaves its peer networks' exchange "
                 "schedule open",
    "F²C": "not implemented: its public code (tiandunx/FFC) is a training loop of its own (dual loaders, an "
           "identity pool, probe and gallery networks) that the method interface does not hold; not built here yet",
}
BSPML_METHODS = {"Contrastive": "contrastive", "Triplet_smooth": "triplet", "Margin": "margin", "FastAP": "fastap",
                 "MS": "ms_rho1", "Proxy-Anchor": "proxy_anchor", "SNR": "snr", "BSPML": "bspml",
                 "RDML": "rdml_tuned"}  # RDML: eta selected from {0.5, 1, 2, 3, 4} (tuning.spaces.rdml)


def tables_after(text: str, heading: str, count: int = 1) -> list[list[list[str]]]:
    """The ``count`` markdown tables that follow the first line containing ``heading``."""
    lines = text[text.index(heading):].splitlines()
    tables, current = [], []
    for line in lines[1:]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
            if len(tables) == count:
                break
    return tables


def clean_name(name: str) -> str:
    return re.sub(r"\s*\[\d+\]", "", name.replace("**", "").replace("*", "")).strip()


def is_section(cells: list[str]) -> bool:
    return all(c == "" for c in cells[1:])


def caption_of(text: str, heading: str) -> str:
    match = re.search(r'"([^"]+)"', text[text.index(heading):].splitlines()[0])
    return match.group(1) if match else ""


def grid_table(table, paper, name, caption, methods, noise, notes=None):
    """Rows = methods, columns = '<DATASET> <rate>%' (or '<DATASET> <metric>')."""
    header, rows = table[0], table[2:]
    out = []
    for cells in rows:
        if is_section(cells):
            continue
        row = clean_name(cells[0])
        for column, value in zip(header[1:], cells[1:]):
            dataset, _, what = column.rpartition(" ")
            if what.endswith("%"):
                rate, metric = float(what[:-1]) / 100, "precision_at_1"
            else:
                rate, metric = 0.0, METRICS[what]
            note, comparable, footnote = (notes or {}).get(row, ("", "yes", ""))
            out.append(dict(paper=paper, table=name, caption=caption, row=row, method=methods.get(row, ""),
                            dataset=DATASETS[dataset], noise=noise, rate=rate, metric=metric,
                            value=float(value.replace("**", "")), std="", comparable=comparable, note=note, footnote=footnote))
    return out


def prism(src: Path) -> pd.DataFrame:
    text = (src / "prism-tables.md").read_text()
    out = []
    for heading, name, noise in (("**Table 1:", "Table 1", "symmetric"), ("**Table 2:", "Table 2", "small_cluster"),
                                 ("**Table 3:", "Table 3", "real")):
        out += grid_table(tables_after(text, heading)[0], "PRISM", name, caption_of(text, heading), PRISM_METHODS,
                          noise)
    timing = tables_after(text, "**Timing table**")[0]
    ours = {"Memory Contrastive Loss (MCL)": "mcl", "MCL + PRISM with centers": "prism",
            "MCL + PRISM without centers": "prism", "Soft Triple": "softtriple",
            "Soft Triple + PRISM with centers": "softtriple_prism"}
    for cells in timing[2:]:
        out.append(dict(paper="PRISM", table="Timing", caption="(unnumbered) Training Time (Seconds)", row=cells[0],
                        method=ours.get(cells[0], ""), dataset="", noise="", rate="", metric="training_seconds",
                        value=float(cells[1].replace(",", "")), std="", comparable="no",
                        note="dataset and hardware not stated; compare ratios (the report's Training time section)"))
    return pd.DataFrame(out)


def sgps(src: Path) -> pd.DataFrame:
    text = (src / "sgps-spec.md").read_text()
    posterior = ("the caption says SGPS-MCL here is the posterior data clean: compare with the sgps_posterior chain, "
                 "not plain sgps (spec A27)", "yes", "yes")
    out = []
    for heading, name, noise, notes in (
            ("### Table I:", "Table I", "symmetric", {"SGPS-MCL (posterior strategy per caption)": posterior}),
            ("### Table II:", "Table II", "small_cluster", None), ("### Table III:", "Table III", "real", None)):
        out += grid_table(tables_after(text, heading)[0], "SGPS", name, caption_of(text, heading), SGPS_METHODS,
                          noise, notes)
    heading = "### Table IV:"
    table = tables_after(text, heading)[0]
    for cells in table[2:]:
        if is_section(cells):
            continue
        row = clean_name(cells[0])
        method = FACE_METHODS.get(row, "")
        # MS1MV0's labels are its own (real) noise; MS1MV2 is its cleaned twin
        noise = {"ms1mv0": "real", "ms1mv2": "clean"}[cells[1].lower()]
        for column, value in zip(table[0][2:], cells[2:]):
            out.append(dict(paper="SGPS", table="Table IV", caption=caption_of(text, heading), row=row,
                            method=method, dataset="faces", noise=noise, rate=0.0, metric=FACE_METRICS[column],
                            value=float(value), std="", comparable="yes", note=FACE_NOT_IMPLEMENTED.get(row, ""),
                            footnote="yes" if row in FACE_NOT_IMPLEMENTED else ""))
    heading = "### Table V:"
    for cells in tables_after(text, heading)[0][2:]:
        cells = [c.replace("**", "") for c in cells]
        row = f"tau={cells[0]} delta={cells[1]} gamma1={cells[2]} gamma2={cells[3]}"
        for column, value in (("P@1", cells[4]), ("MAP@R", cells[5])):
            out.append(dict(paper="SGPS", table="Table V", caption=caption_of(text, heading), row=row,
                            method="", dataset="cars196", noise="symmetric", rate=0.5,
                            metric=METRICS[column], value=float(value), std="", comparable="no",
                            note="hyper-parameter variants of SGPS-MCL (first row = Table I's SGPS-MCL CARS 50%, "
                                 "the posterior strategy); ours: figures.sgps_ablations, its own report section"))
    heading = "### Table VI:"
    for cells in tables_after(text, heading)[0][2:]:
        dataset, rate = re.match(r"(\w+) \((\d+)% noise\)", cells[0]).groups()
        for method, value in (("prism", cells[1]), ("sgps", cells[2])):
            out.append(dict(paper="SGPS", table="Table VI", caption=caption_of(text, heading),
                            row={"prism": "PRISM", "sgps": "SGPS"}[method], method=method,
                            dataset=DATASETS[dataset], noise="symmetric", rate=float(rate) / 100, metric="gpu_hours",
                            value=float(value), std="", comparable="no",
                            note="whole-training GPU hours on an RTX 3090: compare the SGPS/PRISM ratio only"))
    return pd.DataFrame(out)


def bspml(src: Path) -> pd.DataFrame:
    text = (src / "bspml-spec.md").read_text()
    heading = "**Table 1:"
    caption = caption_of(text, heading)
    out = []
    for table in tables_after(text, heading, count=2):
        datasets, current = [], None
        for column in table[0][1:]:
            parts = column.split(" ")
            if len(parts) == 2:
                current, column = parts
            datasets.append((current, column))
        for cells in table[2:]:
            row = clean_name(cells[0])
            for (dataset, column), value in zip(datasets, cells[1:]):
                metric = "nmi" if column == "NMI" else f"recall_at_{column[2:]}"
                out.append(dict(paper="BSPML", table="Table 1", caption=caption, row=row,
                                method=BSPML_METHODS.get(row, ""), dataset=DATASETS[dataset], noise="clean", rate=0.0,
                                metric=metric, value=float(value), std="", comparable="yes",
                                note="SOP columns printed as R@1, 8, 16, 32, 64, 128 (transcribed as printed)"
                                if dataset == "SOP" else ""))
    heading = "**Table 2:"
    table = tables_after(text, heading)[0]
    caption = re.sub(r"\s+", " ", re.search(r'"([^"]+)"', text[text.index(heading):], re.S).group(1))
    for cells in table[2:]:
        for row, value in zip(table[0][2:], cells[2:]):
            mean, std = value.split("±")
            out.append(dict(paper="BSPML", table="Table 2", caption=caption, row=row, method=BSPML_METHODS.get(row, ""),
                            dataset=DATASETS[cells[0]], noise="symmetric_per_class", rate=float(cells[1][:-1]) / 100,
                            metric="recall_at_1", value=float(mean), std=float(std), comparable="yes",
                            note="mean ± SD over at least 10 runs"))
    return pd.DataFrame(out)


#: Within how many points an SGPS cell equal to PRISM's same cell is PRISM's number reprinted (three reprinted cells
#: differ by 0.04-0.17 points: prism-tables.md section 3.2; PRISM-MCL's re-runs differ by 0.3 or more).
REPRINT_WITHIN = 0.2


def reprinted_from_prism(sgps_cells: pd.DataFrame, prism_cells: pd.DataFrame) -> pd.Series:
    """For each SGPS cell: does it hold PRISM's number (the same method, dataset, noise, rate and metric in a PRISM
    table, within :data:`REPRINT_WITHIN` points)? SGPS's Tables I-III reprint PRISM's baselines at 10/20/50%, 25/50%
    and on CARS-98N / Food-101N, except PRISM-MCL where the SGPS authors re-ran it (small-cluster, CARS-98N)."""
    keys = ["method", "dataset", "noise", "rate", "metric"]
    prism_values = prism_cells[prism_cells["method"] != ""].groupby(keys)["value"].apply(list).to_dict()

    def reprinted(cell) -> bool:
        values = prism_values.get(tuple(cell[k] for k in keys), [])
        return cell["method"] != "" and any(abs(v - cell["value"]) <= REPRINT_WITHIN for v in values)

    return sgps_cells.apply(reprinted, axis=1)


def main(src: str, dest: str) -> None:
    src_dir, dest_dir = Path(src), Path(dest)
    dest_dir.mkdir(parents=True, exist_ok=True)
    built = {name: build(src_dir) for name, build in (("prism", prism), ("sgps", sgps), ("bspml", bspml))}
    for name, table in built.items():
        table["footnote"] = table["footnote"].fillna("") if "footnote" in table else ""
        table["settings_of"] = name
        if name == "sgps":
            table.loc[reprinted_from_prism(table, built["prism"]), "settings_of"] = "prism"
        table.to_csv(dest_dir / f"{name}.csv", index=False)
        print(f"{dest_dir / name}.csv: {len(table)} cells in {table['table'].nunique()} tables")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    main(*sys.argv[1:3])
