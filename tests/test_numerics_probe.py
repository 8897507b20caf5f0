"""scripts/numerics_probe.py's comparison: what it counts is the operations both hosts' probes hold."""

import json

from conftest import load_script

numerics_probe = load_script("numerics_probe")


def _probe(kind: str, ops: dict) -> dict:
    return {"host_kind": kind, "cpu": {"model": f"{kind} cpu"}, "ops": ops, "packages": {"torch": "2.x"}}


def test_compare_counts_the_shared_operations_and_names_the_differing_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(numerics_probe, "FOLDER", tmp_path)
    (tmp_path / "AuthenticAMD-25-17.json").write_text(json.dumps(_probe("AuthenticAMD-25-17",
                                                                        {"matmul": "a", "cdist": "b"})))
    mine = _probe("GenuineIntel-6-167", {"matmul": "a", "cdist": "c", "acos": "d"})
    [line] = numerics_probe.compare(mine)
    assert "1 of the 2 operations both probes hold differ: cdist" in line
    assert "1 of this probe's not in that one" in line
    (tmp_path / "GenuineIntel-6-167.json").write_text(json.dumps(mine))
    assert "every operation the same" in numerics_probe.compare(mine)[1]
