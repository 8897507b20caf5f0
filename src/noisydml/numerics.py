"""Which CPU code path the numeric libraries take (``runtime.numerics``, ours), and the host a stage ran on.

Why: the same commit and params gave different bits on two x86-64 machines of the same kind (324 of 330
metrics differed, P@1 by up to 2.2 points). Each numeric library picks its kernels from the CPU it finds and
splits work by the thread count, and each choice orders floating-point sums differently. Measured on the
pretrain stage (README "Reproducibility"): the ISA level of torch's ATen kernels, of oneDNN's convolutions,
of MKL, and the thread count each change the weights; each setting alone is deterministic.

``portable`` pins every library that dispatches on the CPU to the x86-64-v3 level (AVX2 + FMA, which every
x86-64 server and CI runner of the last decade has) and every thread pool to ``runtime.threads``. The pins
are environment variables the libraries read when they load or first run, so :func:`pin` must run before
numpy, torch, faiss, scipy or scikit-learn are imported: the stage entry points call it (through
:func:`noisydml.cli.run_stage`) before they import any pipeline code, and child processes (torchrun ranks,
DataLoader workers) inherit it. :func:`verify` then checks, on the loaded libraries, that the pins took.

``native`` leaves every library to pick the host's fastest path (results then depend on the host).

A leaf module: standard library only (it runs before anything numeric is loaded).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

MODES = ("portable", "native")

#: ``portable``: one code path per library, the x86-64-v3 (AVX2 + FMA) one.
PORTABLE_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",        # torch's ATen kernels (vectorised ops, SLEEF maths)
    "ONEDNN_MAX_CPU_ISA": "AVX2",          # torch's oneDNN (convolutions, some matmuls)
    # torch's MKL BLAS: Conditional Numerical Reproducibility's COMPATIBLE branch, the one MKL honours on every x86
    # vendor. MKL_CBWR=AVX2 (what portable set before) is an Intel-only branch: on an AMD CPU MKL ignores it and runs
    # its AUTO branch (measured: MKL_VERBOSE says "CNR:AUTO", mkl_serv_cbwr_get returns AUTO), so Intel and AMD hosts
    # took different sgemm kernels; COMPATIBLE is taken on both (Intel's MKL developer guide, "Getting Started with
    # Conditional Numerical Reproducibility"). No measurable cost here: the backbones' time is in oneDNN's convolutions.
    "MKL_CBWR": "COMPATIBLE",
    "OPENBLAS_CORETYPE": "Haswell",        # numpy's, scipy's and faiss's OpenBLAS kernels (Haswell = AVX2)
    "FAISS_SIMD_LEVEL": "AVX2",            # faiss's dynamic dispatch (faiss >= 1.12 "DD" builds)
    # numpy's own SIMD loops: no AVX-512 variants (numpy >= 2.3 names the groups X86_V4..., older ones AVX512F...;
    # numpy ignores names it does not know)
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL",
}
#: numpy's dispatch targets with AVX-512 (either naming). A name counts only where it is a dispatch target of the
#: loaded numpy: numpy >= 2.3 still reports the CPU's AVX512F, AVX512_CLX, ... as features (true on an AVX-512
#: host whatever is disabled), but dispatches only to X86_V4, AVX512_ICL and AVX512_SPR loops.
NUMPY_AVX512 = ("X86_V4", "AVX512_ICL", "AVX512_SPR", "AVX512F", "AVX512_SKX")
#: The thread pools a fixed ``runtime.threads`` sets (torch's intra-op pool reads OMP_NUM_THREADS when it starts).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: Libraries whose kernels the pins decide: they must not be loaded before :func:`pin`.
NUMERIC_MODULES = ("numpy", "torch", "faiss", "scipy", "sklearn")
#: CPU flags that decide a library's code path (recorded in the host fingerprint).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile")
#: Versions that decide a run's bits besides the CPU (recorded in the host fingerprint).
PACKAGES = ("torch", "numpy", "faiss-cpu", "faiss-gpu", "scipy", "scikit-learn", "pytorch-metric-learning",
            "torchvision", "pandas", "matplotlib", "pillow")


class NumericsError(RuntimeError):
    """The requested numerics cannot be had on this host, or were asked for too late."""


#: Set (to "1") with :func:`environment` in a process's environment when it is created: its libraries loaded with
#: the pins in place, so :func:`pin` accepts them loaded (the launcher's warm worker processes).
PINNED_AT_START = "NOISYDML_NUMERICS_PINNED_AT_START"


def environment(runtime: dict[str, Any]) -> dict[str, str]:
    """The environment ``runtime.numerics`` and ``runtime.threads`` need, computed without setting it (a
    launcher hands it to the processes it creates); raises where this host cannot have it."""
    mode, threads = runtime["numerics"], runtime["threads"]
    if mode not in MODES:
        raise NumericsError(f"runtime.numerics: {mode!r}; allowed: {', '.join(MODES)}")
    wanted: dict[str, str] = {}
    if mode == "portable":
        if threads < 1:
            raise NumericsError("runtime.threads: 0 (the host's core count) with runtime.numerics: portable; "
                                "allowed: a fixed count >= 1 (the thread count changes the bits)")
        missing = _missing_isa()
        if missing:
            raise NumericsError(
                f"runtime.numerics: portable pins the numeric libraries to x86-64 AVX2 + FMA, which this host "
                f"({platform.machine()}) lacks ({missing}); set runtime.numerics: native (results then depend "
                "on the host; README \"Reproducibility\")")
        wanted.update(PORTABLE_ENV)
    if threads:
        wanted.update({name: str(threads) for name in THREAD_ENV})
        if mode == "portable":
            # OpenBLAS (numpy's, scipy's: BSPML's similarity blocks) never runs more threads than the process has
            # usable cores, whatever it is asked, and its sgemm's bits follow its thread count: measured, a
            # one-core host changed BSPML's runs. One thread is the only count every host can give it.
            wanted["OPENBLAS_NUM_THREADS"] = "1"
        if threads * runtime["processes"] > usable_cores():
            # more threads (over all of a run's processes) than cores: OpenMP threads that spin while they wait
            # starve each other (measured ~60x slower); waiting threads sleep instead (no effect on the results)
            wanted["OMP_WAIT_POLICY"] = "PASSIVE"
    return wanted


def pin(runtime: dict[str, Any]) -> dict[str, Any]:
    """Set the environment for ``runtime.numerics`` and ``runtime.threads``; must run before the numeric
    libraries load (or in a process created with that environment and :data:`PINNED_AT_START`). Returns what was
    set, with any value of the caller's environment it replaced."""
    wanted = environment(runtime)
    loaded = [m for m in NUMERIC_MODULES if m in sys.modules]
    if loaded:
        differs = {k: v for k, v in wanted.items() if k != "OMP_WAIT_POLICY" and os.environ.get(k) != v}
        if os.environ.get(PINNED_AT_START) != "1" or differs:
            raise NumericsError(f"runtime.numerics must be applied before {', '.join(loaded)} is imported (its "
                                "kernels are chosen when it loads); call noisydml.numerics.pin first"
                                + (f" (this process was created with other settings: {differs})" if differs else ""))
        return {"numerics": runtime["numerics"], "threads": runtime["threads"], "env": wanted, "replaced": {}}
    replaced = {k: os.environ[k] for k, v in wanted.items() if k in os.environ and os.environ[k] != v}
    os.environ.update(wanted)
    if replaced:
        print("runtime.numerics: replaced " + ", ".join(f"{k}={v!r}" for k, v in sorted(replaced.items()))
              + " of the environment", file=sys.stderr)
    return {"numerics": runtime["numerics"], "threads": runtime["threads"], "env": wanted, "replaced": replaced}


def _missing_isa() -> str:
    """What portable needs and this host lacks ('' when nothing): an x86-64 CPU with AVX2 and FMA."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "not an x86-64 CPU"
    flags = cpu_flags()
    if flags is None:  # no /proc/cpuinfo (macOS, Windows): verify() checks on the loaded libraries instead
        return ""
    lacking = [f for f in ("avx2", "fma") if f not in flags]
    return "no " + " or ".join(lacking) if lacking else ""


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_flags() -> set[str] | None:
    """The CPU's flags from /proc/cpuinfo (Linux), or None where there is none."""
    info = _cpuinfo()
    return set(info.get("flags", "").split()) if info else None


def _cpuinfo() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def verify(runtime: dict[str, Any]) -> dict[str, Any]:
    """The code paths the loaded libraries really took; under ``portable`` raise when one is not the pinned one.

    Checks only what is loaded: torch's ATen capability and MKL's CNR branch, faiss's SIMD level, numpy's dispatch,
    and every
    BLAS/OpenMP pool's architecture and threads (threadpoolctl, when scikit-learn brought it)."""
    taken: dict[str, Any] = {}
    if "torch" in sys.modules:
        import torch

        taken["aten"] = torch.backends.cpu.get_cpu_capability()
        taken["torch_threads"] = torch.get_num_threads()
        branch = mkl_branch()
        if branch is not None:
            taken["mkl_cnr"] = branch
    if "faiss" in sys.modules:
        faiss = sys.modules["faiss"]
        config = getattr(faiss, "SIMDConfig", None)
        taken["faiss"] = config.get_level_name() if config is not None else faiss.get_compile_options()
    if "numpy" in sys.modules:
        from numpy._core._multiarray_umath import __cpu_dispatch__ as targets, __cpu_features__ as features

        taken["numpy_avx512"] = any(features.get(name) for name in NUMPY_AVX512 if name in targets)
    try:
        from threadpoolctl import threadpool_info

        taken["pools"] = sorted(f"{p['prefix']}:{p.get('threading_layer', '-')}:{p.get('architecture', '-')}:"
                                f"{p['num_threads']}" for p in threadpool_info())
    except ImportError:
        pass
    if runtime["numerics"] == "portable":
        wrong = []
        if taken.get("aten", "AVX2") != "AVX2":
            wrong.append(f"torch ATen {taken['aten']}")
        if taken.get("mkl_cnr", "COMPATIBLE") != "COMPATIBLE":
            wrong.append(f"MKL CNR branch {taken['mkl_cnr']}")
        if "faiss" in taken and "AVX2" not in str(taken["faiss"]):
            wrong.append(f"faiss {taken['faiss']}")
        if taken.get("numpy_avx512"):
            wrong.append("numpy AVX-512 loops")
        if taken.get("torch_threads", runtime["threads"]) != runtime["threads"]:
            wrong.append(f"torch threads {taken['torch_threads']}")
        for pool in taken.get("pools", []):
            prefix, layer, arch, threads = pool.split(":")
            if "openblas" in prefix and arch not in ("Haswell", "-"):
                wrong.append(f"{prefix} {arch}")
            # OpenBLAS on its own pthreads: one thread (see pin()); on OpenMP (faiss's) it takes OpenMP's count
            pthreads_blas = "openblas" in prefix and layer == "pthreads"
            if int(threads) != (1 if pthreads_blas else runtime["threads"]):
                wrong.append(f"{prefix} ({layer}) {threads} threads")
        if wrong:
            raise NumericsError("runtime.numerics: portable, but the loaded libraries took another path: "
                                + "; ".join(wrong) + " (a library loaded before the pins were set, or this host "
                                "cannot take the AVX2 path: set runtime.numerics: native)")
    return taken


#: MKL's CNR branch codes (mkl_cbwr_get(MKL_CBWR_BRANCH)), from mkl.h.
MKL_BRANCHES = {2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX", 10: "AVX2",
                11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}


def mkl_branch() -> str | None:
    """The CNR branch torch's MKL runs (``COMPATIBLE``, ``AUTO``, ...), asked of the MKL linked into torch (its
    ``mkl_serv_cbwr_get``); None where torch has no MKL or does not export it (then not checked)."""
    import ctypes

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        path = Path(torch.__file__).parent / "lib" / name
        if path.is_file():
            try:
                get = ctypes.CDLL(str(path)).mkl_serv_cbwr_get
            except (OSError, AttributeError):
                return None
            get.restype = ctypes.c_int
            code = get(1)  # MKL_CBWR_BRANCH
            return MKL_BRANCHES.get(code, f"code {code}")
    return None


def host_fingerprint(runtime: dict[str, Any], environment: bool = False) -> dict[str, Any]:
    """What decides a stage's bits besides params, data and code: CPU (model, ISA flags, caches, usable cores),
    OS and C library, Python and library versions, and the numerics settings. ``id``: a digest of all of it;
    two stages with the same ``id`` produce identical outputs. ``environment``: every installed package's version
    (with ``environment``; not in the id)."""
    info = _cpuinfo()
    flags = cpu_flags() or set()
    body = {
        "machine": platform.machine(),
        "cpu": {"model": info.get("model name", platform.processor()),
                "family/model/stepping": "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping")),
                "isa": [f for f in ISA_FLAGS if f in flags],
                "caches": _caches(),
                "cores": os.cpu_count(), "usable_cores": usable_cores()},
        "os": f"{platform.system()} {platform.release().split('-')[0]}",
        "libc": "-".join(platform.libc_ver()),
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES if _version(name)},
        "numerics": runtime["numerics"], "threads": runtime["threads"],
    }
    body["id"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    # every installed distribution, for the record (requirements/ holds the lock); outside the id, which the
    # packages above decide (another pip or pytest does not change a bit)
    if environment:
        body["environment"] = dict(sorted({d.metadata["Name"].lower(): d.version for d in metadata.distributions()
                                           if d.metadata["Name"]}.items()))
    return body


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _caches() -> list[str]:
    """Cache levels and sizes of CPU 0 (blocking heuristics of BLAS and oneDNN may depend on them)."""
    out = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            out.append("L{}{} {}".format((index / "level").read_text().strip(),
                                         {"Data": "d", "Instruction": "i"}.get((index / "type").read_text().strip(), ""),
                                         (index / "size").read_text().strip()))
        except OSError:
            continue
    return out
