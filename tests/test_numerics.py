"""runtime.numerics: the pins are set before the numeric libraries load, replace what the environment presets,
are checked on the loaded libraries, and the host fingerprint names what decides a stage's bits."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from noisydml import numerics
from noisydml.config import validate_params
from noisydml.schema import ParamsError

PORTABLE = {"numerics": "portable", "threads": 2, "processes": 1}


def _python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (the numeric libraries not yet loaded), this checkout's code first."""
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)


def test_pinning_after_a_numeric_library_loaded_is_refused():
    import numpy  # noqa: F401  (loaded in this test process anyway)

    with pytest.raises(numerics.NumericsError, match=r"before numpy.* is imported"):
        numerics.pin(PORTABLE)


def test_portable_replaces_a_preset_environment_and_the_libraries_take_the_avx2_path():
    """A cluster's environment (one thread, lowest paths) is replaced; torch, faiss, numpy and every BLAS pool
    report the pinned path and thread count."""
    hostile = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "default",
               "ONEDNN_MAX_CPU_ISA": "SSE41", "OPENBLAS_CORETYPE": "Sandybridge", "FAISS_SIMD_LEVEL": "NONE"}
    code = ("import json; from noisydml import numerics as n; r = n.pin({'numerics': 'portable', 'threads': 2, 'processes': 1}); "
            "import numpy, torch, faiss, sklearn; print(json.dumps([r['replaced'], n.verify(r)]))")
    proc = _python(code, hostile)
    assert proc.returncode == 0, proc.stderr
    replaced, taken = json.loads(proc.stdout.strip().splitlines()[-1])
    assert replaced == hostile
    assert taken["aten"] == "AVX2" and taken["faiss"] == "AVX2" and taken["torch_threads"] == 2
    assert taken["mkl_cnr"] == "COMPATIBLE"  # the branch MKL honours on Intel and AMD alike
    assert not taken["numpy_avx512"]
    # OpenBLAS on its own pthreads (numpy's, scipy's) runs one thread: it caps any count at the usable cores
    assert all(p.endswith(":1" if ":pthreads:" in p else ":2") for p in taken["pools"])
    assert all(":Haswell:" in p for p in taken["pools"] if "openblas" in p)
    assert "runtime.numerics: replaced" in proc.stderr


def test_verify_catches_a_library_that_did_not_take_the_pinned_path():
    code = ("import os; from noisydml import numerics as n; n.pin({'numerics': 'portable', 'threads': 2, 'processes': 1}); "
            "os.environ['ATEN_CPU_CAPABILITY'] = 'default'; import torch; n.verify({'numerics': 'portable', 'threads': 2, 'processes': 1})")
    proc = _python(code)
    assert proc.returncode != 0 and "torch ATen DEFAULT" in proc.stderr


def test_mkl_runs_the_pinned_branch_and_verify_names_another():
    """MKL_CBWR=AVX2 is Intel-only: on an AMD CPU MKL runs AUTO instead (why portable pins COMPATIBLE). verify()
    asks MKL which branch it runs and refuses any but COMPATIBLE under portable."""
    code = ("import os; from noisydml import numerics as n; n.pin({'numerics': 'portable', 'threads': 2, 'processes': 1}); "
            "os.environ['MKL_CBWR'] = 'AUTO'; import torch; torch.ones(4, 4) @ torch.ones(4, 4); "
            "n.verify({'numerics': 'portable', 'threads': 2, 'processes': 1})")
    proc = _python(code)
    assert proc.returncode != 0 and "MKL CNR branch AUTO" in proc.stderr
    vendor = (numerics._cpuinfo() or {}).get("vendor_id")
    probe = ("import json, torch; from noisydml import numerics as n; torch.ones(4, 4) @ torch.ones(4, 4); "
             "print(json.dumps(n.mkl_branch()))")
    proc = _python(probe, {"MKL_CBWR": "AVX2"})
    branch = json.loads(proc.stdout.strip().splitlines()[-1])
    if vendor == "AuthenticAMD":
        assert branch == "AUTO"  # the pin portable had before: ignored on AMD


def test_native_leaves_the_libraries_their_own_choice():
    code = ("import json; from noisydml import numerics as n; r = n.pin({'numerics': 'native', 'threads': 0, 'processes': 1}); "
            "import torch; print(json.dumps(r['env']))")
    proc = _python(code, {"ATEN_CPU_CAPABILITY": "default"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}


def test_more_threads_than_cores_wait_passively(monkeypatch):
    monkeypatch.setattr(numerics, "usable_cores", lambda: 1)
    monkeypatch.setattr(numerics, "NUMERIC_MODULES", ())
    monkeypatch.setattr(numerics.os, "environ", {})
    assert numerics.pin(PORTABLE)["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setattr(numerics, "usable_cores", lambda: 4)
    assert "OMP_WAIT_POLICY" not in numerics.pin({**PORTABLE, "processes": 2})["env"]
    assert numerics.pin({**PORTABLE, "processes": 3})["env"]["OMP_WAIT_POLICY"] == "PASSIVE"


def test_portable_on_a_host_without_the_avx2_path_is_refused(monkeypatch):
    monkeypatch.setattr(numerics, "NUMERIC_MODULES", ())
    monkeypatch.setattr(numerics.platform, "machine", lambda: "aarch64")
    with pytest.raises(numerics.NumericsError, match="lacks .*not an x86-64 CPU.*set runtime.numerics: native"):
        numerics.pin(PORTABLE)
    monkeypatch.setattr(numerics.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(numerics, "cpu_flags", lambda: {"sse4_2", "avx"})
    with pytest.raises(numerics.NumericsError, match="no avx2 or fma"):
        numerics.pin(PORTABLE)


def test_portable_needs_a_fixed_thread_count(raw_params):
    raw_params["runtime"].update(numerics="portable", threads=0)
    with pytest.raises(ParamsError, match=r"runtime.threads: 0 .* with runtime.numerics: portable; allowed: a fixed "
                                          r"count >= 1"):
        validate_params(raw_params)
    raw_params["runtime"]["numerics"] = "native"
    assert validate_params(raw_params)["runtime"]["threads"] == 0
    raw_params["runtime"]["numerics"] = "fast"
    with pytest.raises(ParamsError, match=r"runtime.numerics: 'fast' is not allowed; allowed values: portable, native"):
        validate_params(raw_params)


def test_the_fingerprint_names_what_decides_the_bits():
    a = numerics.host_fingerprint(PORTABLE)
    assert a == numerics.host_fingerprint(PORTABLE)  # deterministic on one host
    assert {"cpu", "packages", "numerics", "threads", "libc", "python", "id"} <= set(a)
    assert a["packages"]["torch"] and {"isa", "caches", "usable_cores"} <= set(a["cpu"])
    assert numerics.host_fingerprint({"numerics": "native", "threads": 0})["id"] != a["id"]
    assert numerics.host_fingerprint({**PORTABLE, "threads": 1})["id"] != a["id"]


def test_a_process_created_with_the_pins_may_pin_after_loading_the_libraries():
    """The launcher's warm workers: created with numerics.environment() and the marker, their libraries loaded
    with the pins in place; pin() then accepts them loaded, and refuses when the process's settings differ."""
    runtime = {"numerics": "portable", "threads": 2, "processes": 1}
    env = {**numerics.environment(runtime), numerics.PINNED_AT_START: "1"}
    code = ("import json, numpy, torch; from noisydml import numerics as n; "
            "r = n.pin({'numerics': 'portable', 'threads': 2, 'processes': 1}); "
            "print(json.dumps(n.verify(r)['torch_threads']))")
    proc = _python(code, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "2"
    other = ("import numpy; from noisydml import numerics as n; "
             "n.pin({'numerics': 'portable', 'threads': 1, 'processes': 1})")
    proc = _python(other, env)
    assert proc.returncode != 0 and "created with other settings" in proc.stderr
    proc = _python(code, {k: v for k, v in env.items() if k != numerics.PINNED_AT_START})
    assert proc.returncode != 0 and "before numpy" in proc.stderr


@pytest.mark.skipif("avx512f" not in (numerics.cpu_flags() or set()), reason="needs an AVX-512 host")
def test_numpy_avx512_is_seen_where_numpy_dispatches_to_it_and_only_there():
    """On an AVX-512 host, numpy's own loops take AVX-512 unless pinned; numpy >= 2.3 still reports the CPU's
    AVX512F as a feature under the pins (it is no dispatch target there), which must not count as a path taken."""
    native = ("import json; from noisydml import numerics as n; "
              "import numpy; print(json.dumps(n.verify({'numerics': 'native', 'threads': 2, 'processes': 1})))")
    proc = _python(native, {"NPY_DISABLE_CPU_FEATURES": ""})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["numpy_avx512"]
    pinned = ("import json; from noisydml import numerics as n; r = n.pin({'numerics': 'portable', 'threads': 2, "
              "'processes': 1}); import numpy; print(json.dumps(n.verify(r)))")
    proc = _python(pinned)
    assert proc.returncode == 0, proc.stderr
    assert not json.loads(proc.stdout.strip().splitlines()[-1])["numpy_avx512"]
