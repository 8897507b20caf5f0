"""What a person looks at: the suspected samples ranked over every detector, as a CSV and an HTML contact sheet.

A sample's **consensus** is the mean of its rank percentiles over the detectors, weighted by their measured
reliability (:data:`RELIABILITY`; 1 = every detector's most suspected) and ``agree`` counts the detectors that
flag it; the sheet shows the top ``top_n`` as thumbnails with the given label, the suggested one (the most common
suggestion among the detectors), the consensus and the agreement, each beside a few images of the given class and of the suggested class. Everything is written into one
folder (``index.html``, ``suspects.csv``, ``thumbs/``): it opens from the file system, nothing is fetched.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

#: Ours: how many images of each class involved the sheet shows beside a suspect.
CLASS_EXAMPLES = 3
THUMB = 64


#: Ours: each detector's weight in the consensus, its mean AUROC minus chance (0.5) over the embedded datasets'
#: known noise (glyphs: 7 noise settings x 2 methods x 3 seeds, ``scripts/label_audit.py --csv``; docs/label-audit.md,
#: "Which detector to trust"), so a detector that ranks barely above chance barely moves it. Measured on data with
#: injected noise, never on the data audited. ``method``: a run's own decisions (PRISM's there).
RELIABILITY = {"method": 0.204, "datalab": 0.420, "confident_learning": 0.473, "knn_confident_learning": 0.420,
               "centroid_confident_learning": 0.477, "knn_disagreement": 0.420, "open_set": 0.124}


def rank_suspects(audits: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per sample, most suspected first (ties by sample id): ``sample_id, given_label, consensus, agree,
    detectors, suggested_label, suggested_by`` (how many detectors suggest that class) and each detector's score
    (``score_<name>``)."""
    names = sorted(audits)
    base = audits[names[0]][["sample_id", "given_label"]].set_index("sample_id")
    percentiles, flags, suggestions = [], [], []
    for name in names:
        frame = audits[name].set_index("sample_id").loc[base.index]
        base[f"score_{name}"] = frame["score"].to_numpy()
        percentiles.append(frame["score"].rank(pct=True).to_numpy())
        flags.append(frame["flagged"].fillna(False).to_numpy(bool))
        suggestions.append(frame["suggested_label"].to_numpy())
    unknown = sorted({name.split("/")[-1] for name in names} - set(RELIABILITY))  # "<run>/<detector>", "<detector>"
    if unknown:
        raise ValueError(f"detector {unknown[0]!r} has no measured weight; allowed: {', '.join(RELIABILITY)}")
    weights = np.array([RELIABILITY[name.split("/")[-1]] for name in names])
    base["consensus"] = weights @ np.array(percentiles) / weights.sum()
    base["agree"] = np.sum(flags, axis=0)
    base["detectors"] = len(names)
    stacked = np.stack(suggestions, axis=1)
    common = [_most_common(row[row >= 0]) for row in stacked]
    base["suggested_label"] = [label for label, _ in common]
    base["suggested_by"] = [count for _, count in common]
    return base.reset_index().sort_values(["consensus", "sample_id"], ascending=[False, True],
                                          kind="stable").reset_index(drop=True)


def _most_common(values: np.ndarray) -> tuple[int, int]:
    """The most common value (the smallest of those tied) and how many times it occurs; (-1, 0) for none."""
    if len(values) == 0:
        return -1, 0
    found, counts = np.unique(values, return_counts=True)
    return int(found[np.argmax(counts)]), int(counts.max())


def _thumb(image, path: Path) -> None:
    """A thumbnail of ``image``: a uint8 HWC array, or an image file's path (a dataset stored as files)."""
    if isinstance(image, (str, Path)):
        with Image.open(image) as opened:
            img = opened.convert("RGB")
    else:
        image = np.asarray(image)
        img = Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image)
    img.resize((THUMB, THUMB), Image.NEAREST).save(path)


def image_path(image) -> str:
    """An image's file path where the dataset stores files (else empty: an image held in an array)."""
    return str(image) if isinstance(image, (str, Path)) else ""


def named(suspects: pd.DataFrame, images, sample_ids: np.ndarray, class_names: list[str]) -> pd.DataFrame:
    """``suspects`` with what a person needs to find each row: ``path`` (the image's file, empty for an image held in
    an array), ``given_class`` and ``suggested_class`` (the labels' class names; empty where none)."""
    position = pd.Series(np.arange(len(sample_ids)), index=sample_ids)
    rows = position.loc[suspects["sample_id"].to_numpy()].to_numpy()
    out = suspects.copy()
    out.insert(1, "path", [image_path(images[r]) for r in rows])
    out.insert(3, "given_class", [class_names[k] for k in suspects["given_label"]])
    out["suggested_class"] = ["" if k < 0 else class_names[k] for k in suspects["suggested_label"]]
    return out


def write_sheet(suspects: pd.DataFrame, images, sample_ids: np.ndarray, labels: np.ndarray, class_names: list[str],
                out_dir: str | Path, top_n: int = 50, title: str = "Suspected labels",
                conflicts: list[tuple[int, int, int, int]] = ()) -> Path:
    """``out_dir/index.html`` (+ ``suspects.csv``, ``conflicts.csv``, ``thumbs/``): the top ``top_n`` of
    ``suspects`` with thumbnails, file paths and class names, then every pair of near-duplicates with conflicting
    labels (``conflicts``: ``(sample_id, other_id, given_label, other_label)``,
    :func:`~noisydml.audit.detectors.conflicting_duplicates`); ``images[i]`` is sample ``sample_ids[i]``'s image
    (uint8 HWC, or its file's path), ``labels`` its given label, ``class_names[label]`` a label's name. Returns the
    page's path."""
    out = Path(out_dir)
    thumbs = out / "thumbs"
    thumbs.mkdir(parents=True, exist_ok=True)
    position = pd.Series(np.arange(len(sample_ids)), index=sample_ids)
    # a class's examples: its members the detectors trust most (lowest consensus) -- under noisy labels a class's
    # first members may well be wrong ones
    trust = suspects.set_index("sample_id")["consensus"].reindex(sample_ids).to_numpy()
    order = np.lexsort((np.arange(len(labels)), trust))
    members = pd.Series(order).groupby(labels[order], sort=False).apply(list).to_dict()
    named(suspects, images, sample_ids, class_names).to_csv(out / "suspects.csv", index=False)
    pairs = pd.DataFrame(list(conflicts), columns=["sample_id", "other_id", "given_label", "other_label"])
    pairs = pairs.assign(path=[image_path(images[position[i]]) for i in pairs["sample_id"]],
                         other_path=[image_path(images[position[i]]) for i in pairs["other_id"]],
                         given_class=[class_names[k] for k in pairs["given_label"]],
                         other_class=[class_names[k] for k in pairs["other_label"]])
    pairs.to_csv(out / "conflicts.csv", index=False)

    def name(label: int) -> str:
        return "" if label < 0 else class_names[label]

    def where(sample: int) -> str:
        path = image_path(images[position[sample]])
        return f"sample {sample}" + (f'<br><span class="path">{html.escape(path)}</span>' if path else "")

    def img(sample: int) -> str:
        path = thumbs / f"{sample}.png"
        if not path.exists():
            _thumb(images[position[sample]], path)
        return f'<img src="thumbs/{sample}.png" width="{THUMB}" height="{THUMB}" alt="sample {sample}">'

    def examples(label: int, besides: int) -> str:
        if label < 0:
            return ""
        rows = [r for r in members.get(label, []) if sample_ids[r] != besides][:CLASS_EXAMPLES]
        return "".join(img(int(sample_ids[r])) for r in rows)

    body = []
    for rank, row in enumerate(suspects.head(top_n).itertuples(index=False), start=1):
        sample, given, suggested = int(row.sample_id), int(row.given_label), int(row.suggested_label)
        body.append(
            "<tr>"
            f"<td>{rank}</td><td>{img(sample)}<br>{where(sample)}</td>"
            f"<td>{html.escape(name(given))}</td><td>{html.escape(name(suggested)) or '&ndash;'}</td>"
            f"<td>{row.consensus:.3f}</td><td>{row.agree} of {row.detectors}</td>"
            f'<td class="ex">{examples(given, sample)}</td><td class="ex">{examples(suggested, sample)}</td>'
            "</tr>")
    page = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
            "table{border-collapse:collapse}img{image-rendering:pixelated;margin:1px}td.ex{white-space:nowrap}"
            ".path{font-size:smaller;color:#555;word-break:break-all}"
            "</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>The {min(top_n, len(suspects))} samples the detectors suspect most, of {len(suspects)}: consensus = "
            "mean rank percentile over the detectors (1 = every detector's first); agree = detectors that flag "
            "the sample. Beside each, images of its given class and of the suggested one.</p>",
            "<table><thead><tr><th>#</th><th>image</th><th>given label</th><th>suggested</th><th>consensus</th>"
            "<th>agree</th><th>given class</th><th>suggested class</th></tr></thead><tbody>",
            *body, "</tbody></table>",
            f'<h2 id="conflicts">Near-duplicates with conflicting labels ({len(pairs)})</h2>',
            "<p>Pairs of training images closer than cleanlab's near-duplicate threshold (0.13 x the median distance "
            "to a nearest neighbour) that carry different labels: one label is wrong, or the classes overlap. "
            + ("None found." if len(pairs) else f"All in conflicts.csv; the first {min(top_n, len(pairs))} here.")
            + "</p>",
            *(["<table><thead><tr><th>image</th><th>label</th><th>near-duplicate</th><th>its label</th></tr>"
               "</thead><tbody>"] + [
                f"<tr><td>{img(int(a))}<br>{where(int(a))}</td><td>{html.escape(name(int(la)))}</td>"
                f"<td>{img(int(b))}<br>{where(int(b))}</td><td>{html.escape(name(int(lb)))}</td></tr>"
                for a, b, la, lb in pairs[["sample_id", "other_id", "given_label", "other_label"]].head(top_n)
                .itertuples(index=False)] + ["</tbody></table>"] if len(pairs) else []),
            "</body></html>"]
    page_path = out / "index.html"
    page_path.write_text("\n".join(page), encoding="utf-8")
    return page_path
