"""What a person looks at: the suspected samples ranked over every detector, as a CSV and an HTML contact sheet.

A sample's **consensus** is the mean of its rank percentiles over the detectors (1 = every detector's most
suspected) and ``agree`` counts the detectors that flag it; the sheet shows the top ``top_n`` as thumbnails with
the given label, the suggested one (the most common suggestion among the detectors), the consensus and the
agreement, each beside a few images of the given class and of the suggested class. Everything is written into one
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


def rank_suspects(audits: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per sample, most suspected first: ``sample_id, given_label, consensus, agree, detectors,
    suggested_label`` and each detector's score (``score_<name>``)."""
    names = sorted(audits)
    base = audits[names[0]][["sample_id", "given_label"]].set_index("sample_id")
    percentiles, flags, suggestions = [], [], []
    for name in names:
        frame = audits[name].set_index("sample_id").loc[base.index]
        base[f"score_{name}"] = frame["score"].to_numpy()
        percentiles.append(frame["score"].rank(pct=True).to_numpy())
        flags.append(frame["flagged"].fillna(False).to_numpy(bool))
        suggestions.append(frame["suggested_label"].to_numpy())
    base["consensus"] = np.mean(percentiles, axis=0)
    base["agree"] = np.sum(flags, axis=0)
    base["detectors"] = len(names)
    stacked = np.stack(suggestions, axis=1)
    base["suggested_label"] = [_most_common(row[row >= 0]) for row in stacked]
    return base.reset_index().sort_values(["consensus", "sample_id"], ascending=[False, True],
                                          kind="stable").reset_index(drop=True)


def _most_common(values: np.ndarray) -> int:
    if len(values) == 0:
        return -1
    found, counts = np.unique(values, return_counts=True)
    return int(found[np.argmax(counts)])


def _thumb(image, path: Path) -> None:
    """A thumbnail of ``image``: a uint8 HWC array, or an image file's path (a dataset stored as files)."""
    if isinstance(image, (str, Path)):
        with Image.open(image) as opened:
            img = opened.convert("RGB")
    else:
        image = np.asarray(image)
        img = Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image)
    img.resize((THUMB, THUMB), Image.NEAREST).save(path)


def write_sheet(suspects: pd.DataFrame, images, sample_ids: np.ndarray, labels: np.ndarray, class_names: list[str],
                out_dir: str | Path, top_n: int = 50, title: str = "Suspected labels") -> Path:
    """``out_dir/index.html`` (+ ``suspects.csv``, ``thumbs/``): the top ``top_n`` of ``suspects`` with
    thumbnails; ``images[i]`` is sample ``sample_ids[i]``'s image (uint8 HWC, or its file's path), ``labels`` its
    given label,
    ``class_names[label]`` a label's name. Returns the page's path."""
    out = Path(out_dir)
    thumbs = out / "thumbs"
    thumbs.mkdir(parents=True, exist_ok=True)
    position = pd.Series(np.arange(len(sample_ids)), index=sample_ids)
    # a class's examples: its members the detectors trust most (lowest consensus) -- under noisy labels a class's
    # first members may well be wrong ones
    trust = suspects.set_index("sample_id")["consensus"].reindex(sample_ids).to_numpy()
    order = np.lexsort((np.arange(len(labels)), trust))
    members = pd.Series(order).groupby(labels[order], sort=False).apply(list).to_dict()
    suspects.to_csv(out / "suspects.csv", index=False)

    def name(label: int) -> str:
        return "" if label < 0 else class_names[label]

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
            f"<td>{rank}</td><td>{img(sample)}<br>sample {sample}</td>"
            f"<td>{html.escape(name(given))}</td><td>{html.escape(name(suggested)) or '&ndash;'}</td>"
            f"<td>{row.consensus:.3f}</td><td>{row.agree} of {row.detectors}</td>"
            f'<td class="ex">{examples(given, sample)}</td><td class="ex">{examples(suggested, sample)}</td>'
            "</tr>")
    page = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
            "table{border-collapse:collapse}img{image-rendering:pixelated;margin:1px}td.ex{white-space:nowrap}"
            "</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>The {min(top_n, len(suspects))} samples the detectors suspect most, of {len(suspects)}: consensus = "
            "mean rank percentile over the detectors (1 = every detector's first); agree = detectors that flag "
            "the sample. Beside each, images of its given class and of the suggested one.</p>",
            "<table><thead><tr><th>#</th><th>image</th><th>given label</th><th>suggested</th><th>consensus</th>"
            "<th>agree</th><th>given class</th><th>suggested class</th></tr></thead><tbody>",
            *body, "</tbody></table></body></html>"]
    page_path = out / "index.html"
    page_path.write_text("\n".join(page), encoding="utf-8")
    return page_path
