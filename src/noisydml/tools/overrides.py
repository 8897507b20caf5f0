"""``-S`` as a transaction: overrides applied to a copy, the result validated whole, and only then written, as a
minimal edit of the user's file.

What a ``-S`` *means* is DVC's: ``dvc exp run -S`` applies Hydra's override grammar with DVC's own
:func:`dvc.utils.hydra.apply_overrides`, and so do we, on a copy in a temporary folder. What DVC *writes* is the
whole file again through ruamel.yaml's round-trip dumper (DVC 3.x): flow lists rewrapped into block lists, YAML
anchors and aliases expanded (``&default_methods`` / ``*default_methods`` become two copies), comments next to
rewritten values lost; one key changes ~700 lines of our params.yaml. Ours changes the values that changed and
nothing else: the differences between the file's data before and after DVC's override are located in the file's
text (ruamel's composer gives each value's span) and rewritten in place, one flow-style value each (a new key is one
new line). The edited text must load to exactly DVC's data; where it does not (an override of an anchor's own
value, which DVC copies to its aliases' places first), DVC's whole-file form is written, and the caller is told.

A refused override, or ``--dry``, writes nothing; the write itself is atomic (:func:`noisydml.io.write_text`: a
temporary beside the file, renamed onto it), so a kill leaves the old file or the new one.
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noisydml.schema import ParamsError, flow

#: A value the override removes (``~key``), in :func:`changes`.
REMOVED = object()


@dataclass
class Overridden:
    """``params`` after ``overrides``: the data DVC's ``-S`` gives, and the text ours writes for it."""

    path: Path
    overrides: list[str]
    data: dict  # the whole file's data after the overrides (DVC's)
    text: str  # the file's text after the overrides: ours, or DVC's whole-file form (``careful`` False)
    careful: bool  # True: only the changed values were rewritten (comments, anchors, layout kept)
    changed: list[tuple[str, ...]] = field(default_factory=list)  # the key paths whose values changed

    def write(self) -> None:
        """Write :attr:`text` onto the file, atomically."""
        from noisydml.io import write_text

        write_text(self.path, self.text)

    def changed_keys(self) -> list[str]:
        return [".".join(map(str, key)) for key in self.changed]


def apply(path: str | Path, overrides: list[str]) -> Overridden:
    """``path`` after ``overrides``, computed on a copy (the file is not touched). Raises
    :class:`~noisydml.schema.ParamsError` for an override DVC refuses (its grammar, a key that does not exist
    without ``+``)."""
    from noisydml.config import read_params_file

    path = Path(path)
    before_text = path.read_text()
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / path.name
        shutil.copy(path, copy)
        dvc_apply(copy, overrides)
        after = read_params_file(copy)
        dvc_text = copy.read_text()
    before = read_params_file(path)
    changed = changes(before, after)
    text = edited(before_text, changed, before)
    careful = text is not None and _load(text) == after
    return Overridden(path, list(overrides), after, text if careful else dvc_text, careful,
                      [key for key, _ in changed])


def dvc_apply(path: Path, overrides: list[str]) -> None:
    """DVC's own ``-S`` on ``path`` (a copy), its refusals as :class:`ParamsError` naming the override."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    try:
        apply_overrides(path, overrides)
    except InvalidArgumentError as e:
        cause = e.__cause__ or e
        raise ParamsError(f"-S {' -S '.join(overrides)}: DVC refuses it: {str(cause).strip()}"
                          + _missing_key_hint(str(cause))) from None


def _missing_key_hint(message: str) -> str:
    if "Could not override" in message or "Key '" in message:
        return " (a key that is not in params.yaml is added with a leading '+': -S +section.key=value)"
    return ""


def changes(before: Any, after: Any, key: tuple = ()) -> list[tuple[tuple, Any]]:
    """The values that differ between two loaded files, as (key path, new value or :data:`REMOVED`), in the
    order of ``after``: a mapping in both is compared key by key, anything else (lists included) as a whole."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for k in before:
            if k not in after:
                out.append(((*key, k), REMOVED))
        for k, v in after.items():
            if k not in before:
                out.append(((*key, k), v))
            else:
                out.extend(changes(before[k], v, (*key, k)))
        return out
    if before == after and type(before) is type(after):
        return []
    return [(key, after)]


def _load(text: str) -> Any:
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(text)


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    text: str


def edited(text: str, changed: list[tuple[tuple, Any]], before: Any = None) -> str | None:
    """``text`` (whose data is ``before``) with each changed value rewritten in place (None: one cannot be located;
    the caller then takes DVC's form)."""
    if not changed:
        return text
    from ruamel.yaml import YAML
    from ruamel.yaml.nodes import MappingNode

    root = YAML(typ="rt").compose(text)
    if not isinstance(root, MappingNode):
        return None
    spans = _Spans(text)
    spans.visit(root, ())
    edits = []
    changed_keys = {key for key, _ in changed}
    for key, value in changed:
        edit = spans.edit(key, value)
        if edit is None:
            return None
        edits.append(edit)
        # DVC's override of an anchored value leaves its aliases the old value (Hydra sees copies): write it there
        if value is not REMOVED and key in spans.values:
            for start, end, where in spans.aliases.get(id(spans.values[key][2]), []):
                if where not in changed_keys:
                    edits.append(_Edit(start, end, flow(_at(before, where))))
    edits.sort(key=lambda e: (e.start, e.end))
    for a, b in zip(edits, edits[1:]):
        if b.start < a.end:
            return None
    for e in reversed(edits):
        text = text[: e.start] + e.text + text[e.end:]
    return text


class _Spans:
    """Where each key's value is written in the text: (start, end) of the value as written at that key (an
    alias's ``*name`` where the value is an alias), and each mapping's layout, for a new key."""

    def __init__(self, text: str):
        self.text = text
        self.values: dict[tuple, tuple[int, int, Any]] = {}  # key path -> (start, end, node)
        self.mappings: dict[tuple, Any] = {}  # key path -> MappingNode (written there, not an alias)
        self.keys: dict[tuple, Any] = {}  # key path -> its key node
        self.aliases: dict[int, list[tuple[int, int, tuple]]] = {}  # an anchored node -> where it is aliased
        self._seen: set[int] = set()

    def visit(self, node, key: tuple) -> None:
        from ruamel.yaml.nodes import MappingNode

        if id(node) in self._seen:
            return  # an alias: its text is the anchor's, elsewhere
        self._seen.add(id(node))
        if not isinstance(node, MappingNode):
            return
        self.mappings[key] = node
        for key_node, value_node in node.value:
            if key_node.tag.endswith(":merge"):
                continue  # a merge key's entries belong to the mapping it names
            k = (*key, _key_value(key_node))
            self.keys[k] = key_node
            if id(value_node) in self._seen:  # written here as ``*name``
                match = re.compile(r"\s*:\s*(\*[^\s,\]}#]+)").match(self.text, key_node.end_mark.index)
                if match:
                    self.values[k] = (match.start(1), match.end(1), value_node)
                    self.aliases.setdefault(id(value_node), []).append((match.start(1), match.end(1), k))
                continue
            start, end = value_node.start_mark.index, value_node.end_mark.index
            self.values[k] = (start, _content_end(self.text, start, end), value_node)
            self.visit(value_node, k)

    def edit(self, key: tuple, value: Any) -> _Edit | None:
        if value is REMOVED:
            return self._removal(key)
        if key in self.values:
            start, end, node = self.values[key]
            anchor = getattr(node, "anchor", None)
            written = self.text[start:end]
            prefix = f"&{anchor} " if anchor and written.startswith("&") else ""
            return _Edit(start, end, prefix + flow(value))
        parent = self.mappings.get(key[:-1])
        if parent is None:
            return None
        entry = f"{flow(key[-1])}: {flow(value)}"
        if parent.flow_style:
            close = parent.end_mark.index - 1
            if self.text[close] != "}":
                return None
            inside = self.text[parent.start_mark.index + 1: close].strip()
            return _Edit(close, close, (", " if inside else "") + entry)
        if not parent.value:
            return None
        last_key, last_value = parent.value[-1]
        column = parent.value[0][0].start_mark.column
        at = _content_end(self.text, last_value.start_mark.index, last_value.end_mark.index)
        at = self.text.find("\n", at)  # after a comment on the last value's line
        at = len(self.text) if at < 0 else at
        return _Edit(at, at, "\n" + " " * column + entry)

    def _removal(self, key: tuple) -> _Edit | None:
        parent = self.mappings.get(key[:-1])
        if key not in self.values or parent is None or parent.flow_style:
            return None
        key_node = self.keys[key]
        start = self.text.rfind("\n", 0, key_node.start_mark.index) + 1
        if self.text[start:key_node.start_mark.index].strip():
            return None  # not the first thing on its line
        end = self.text.find("\n", self.values[key][1])
        return _Edit(start, len(self.text) if end < 0 else end + 1, "")


def _at(data: Any, key: tuple) -> Any:
    for k in key:
        data = data[k]
    return data


def _key_value(node) -> Any:
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(node.value) if node.tag.endswith((":int", ":float", ":bool")) else node.value


def _content_end(text: str, start: int, end: int) -> int:
    """The end of a value's own text: a block collection's end mark lies after the blank lines and comments that
    follow it, which belong to what comes next."""
    lines = text[start:end].split("\n")
    while len(lines) > 1 and (not lines[-1].strip() or lines[-1].lstrip().startswith("#")):
        lines.pop()
    content = "\n".join(lines)
    last = content.split("\n")[-1]
    if len(lines) > 1 and "#" in last:  # a block value's last line may end with a comment: keep it
        content = content[: len(content) - len(last)] + _without_comment(last)
    return start + len(content.rstrip())


def _without_comment(line: str) -> str:
    match = re.search(r"\s+#", line)
    return line[: match.start()] if match else line


def touches(declared: str, changed: str) -> bool:
    """Whether a stage's declared params key (``train``, ``methods.ms``) covers a changed key path, or lies
    inside it (a new ``methods`` mapping changes ``methods.ms``)."""
    return changed == declared or changed.startswith(declared + ".") or declared.startswith(changed + ".")


def stage_names_with(dvc_yaml: Path, params_text: str) -> set[str]:
    """The stages ``dvc_yaml`` expands into under a params file of ``params_text`` (its ``foreach`` over the
    grid): DVC's own parser, in a scratch repository holding only those two files; nothing is hashed or run."""
    from dvc.repo import Repo

    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(dvc_yaml, Path(folder) / "dvc.yaml")
        (Path(folder) / "params.yaml").write_text(params_text)
        repo = Repo.init(folder, no_scm=True)
        try:
            return {stage.name for stage in repo.index.stages}  # dvc.yaml at the root: its names
        finally:
            repo.close()
