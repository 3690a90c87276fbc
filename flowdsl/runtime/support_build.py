"""Building the support library (``prebuilt/``) for an NCCL device ABI and an arch.

The checked-in builds are made by ``prebuilt/build.sh``, which runs this module
with ``--all``: for each supported NCCL release it downloads that exact
``nvidia-nccl-cu13`` wheel for its headers, compiles
``prebuilt/src/flowdsl_support.cu`` to LTO-IR for each arch with nvcc, and
``prebuilt/src/flowdsl_gin.cu`` (the GIN library) once with every GIN backend the
headers have and once per backend (:func:`gin_defines`), reads the host-side
struct layouts the runtime needs (``ncclDevComm`` size and GIN connection types,
``ncclDevCommRequirements`` field offsets and initializer), and writes
``prebuilt/build/manifest.json``. At run time, a loaded NCCL without a
checked-in build gets one built at first use from its installed headers
(:func:`build_for_installed`), cached on disk.

CFT builds are separate (:func:`build_cft`, ``--cft``): ``prebuilt/src/flowdsl_cft.cu``
compiled for sm_100 by a CUDA 13.3 nvcc (NCCL's headers compile CFT only with
CUDA >= 13.3), which :func:`install_cft_toolkit` installs from PyPI at pinned
versions into ``$FLOWDSL_CFT_TOOLKIT``. They are recorded under the manifest's
``"cft"`` key with that toolkit's version, so the CUDA 13.0 builds stay as they are.

"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .._release import SUPPORTED_RELEASES
from ..enums import GinBackend
from ..errors import SupportLibraryError

__all__ = [
    "SUPPORTED_VERSIONS", "ARCHS", "PREBUILT_DIR", "source_digest", "compile_ltoir", "read_layout",
    "build_all", "build_for_installed", "installed_include_dir", "nvcc_path", "header_version_code",
    "defined_symbols", "CFT_VERSIONS", "CFT_SOURCES", "CFT_TOOLKIT", "cft_toolkit_dir", "cft_nvcc_path",
    "install_cft_toolkit", "build_cft", "GIN_SOURCE", "gin_backends_in", "gin_defines", "gin_build_name",
    "installed_gin_backends",
]

#: NCCL releases with a checked-in build (one list: ``flowdsl._release``).
SUPPORTED_VERSIONS = SUPPORTED_RELEASES
#: Targets of every build.
ARCHS = ("sm_80", "sm_90", "sm_100")
#: NCCL releases with a checked-in CFT build (CFT needs NCCL >= 2.31), and its targets.
CFT_VERSIONS = ("2.32.3",)
CFT_ARCHS = ("sm_100",)
#: The CUDA 13.3 compiler the CFT builds are made with (PyPI wheels, installed by install_cft_toolkit).
CFT_TOOLKIT = {"nvidia-cuda-nvcc": "13.3.73", "nvidia-cuda-crt": "13.3.73", "nvidia-nvvm": "13.3.73",
               "nvidia-cuda-runtime": "13.3.29", "nvidia-cuda-cccl": "13.3.5.0.6"}


def _prebuilt_dir() -> Path:
    """Where ``prebuilt/`` is: ``$FLOWDSL_PREBUILT_DIR``, else the copy an installed wheel carries
    (``flowdsl/_prebuilt``, see setup.py), else the source tree's (an editable install, a checkout)."""
    if os.environ.get("FLOWDSL_PREBUILT_DIR"):
        return Path(os.environ["FLOWDSL_PREBUILT_DIR"])
    package = Path(__file__).resolve().parents[1]
    if (package / "_prebuilt" / "build" / "manifest.json").exists():
        return package / "_prebuilt"
    return package.parent / "prebuilt"


#: The support library's sources and builds (:func:`_prebuilt_dir`).
PREBUILT_DIR = _prebuilt_dir()
SOURCES = ("src/flowdsl_support.cu", "include/flowdsl_support.h", "src/flowdsl_gin.cu", "include/flowdsl_gin.h",
           "src/flowdsl_internal.cuh")
#: The GIN library's source, built once per backend (``-DNCCL_GIN_<OTHER>_ENABLE=0``) and once with all.
GIN_SOURCE = "src/flowdsl_gin.cu"
CFT_SOURCES = ("src/flowdsl_cft.cu", "include/flowdsl_cft.h", "src/flowdsl_internal.cuh", "include/flowdsl_support.h")

# Host program that prints what the runtime must know about the ABI's structs.
_LAYOUT_PROGRAM = r"""
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <nccl_device.h>
#define FIELD(f) std::printf("\"%s\": [%zu, %zu],", #f, offsetof(ncclDevCommRequirements, f), \
                             sizeof(((ncclDevCommRequirements*)0)->f))
// Where ncclDevComm records its GIN connections: [offset of the count, offset of the types
// (uint8 ncclNetDeviceType each)]. NCCL 2.28 calls them ginContextCount / ginTypes.
template <typename C> auto gin_types(int) -> decltype(&C::ginNetDeviceTypes, void()) {
  std::printf("\"gin_types\": [%zu, %zu], ", offsetof(C, ginConnectionCount), offsetof(C, ginNetDeviceTypes));
}
template <typename C> auto gin_types(long) -> decltype(&C::ginTypes, void()) {
  std::printf("\"gin_types\": [%zu, %zu], ", offsetof(C, ginContextCount), offsetof(C, ginTypes));
}
template <typename C> void gin_types(...) {}
// The GIN contexts a kernel may use (uint8 in NCCL 2.28, uint32 later): [offset, size].
template <typename C> auto gin_context_count(int) -> decltype(&C::ginContextCount, void()) {
  std::printf("\"gin_context_count\": [%zu, %zu], ", offsetof(C, ginContextCount), sizeof(((C*)0)->ginContextCount));
}
template <typename C> void gin_context_count(...) {}
// Requirement fields of later releases (GIN connection shapes, the world GIN barrier, ...): printed where
// the release has them.
#define OPTIONAL_FIELD(f)                                                                        \
  template <typename R> auto optional_##f(int) -> decltype(&R::f, void()) {                      \
    std::printf("\"%s\": [%zu, %zu],", #f, offsetof(R, f), sizeof(((R*)0)->f));               \
  }                                                                                              \
  template <typename R> void optional_##f(...) {}
OPTIONAL_FIELD(ginConnectionType) OPTIONAL_FIELD(ginExclusiveContexts) OPTIONAL_FIELD(ginQueueDepth)
OPTIONAL_FIELD(ginTrafficClass) OPTIONAL_FIELD(worldGinBarrierCount) OPTIONAL_FIELD(ginStrongSignalsRequired)
OPTIONAL_FIELD(ginVaSignalsRequired) OPTIONAL_FIELD(ginCustomStride) OPTIONAL_FIELD(ginType)
int main() {
  // Static storage, so that padding bytes are zero and the manifest is reproducible.
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  static ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  static ncclDevCommRequirements reqs;
#endif
  std::printf("{\"version_code\": %d, \"dev_comm_size\": %zu, \"dev_comm_align\": %zu, ",
              NCCL_VERSION_CODE, sizeof(ncclDevComm), alignof(ncclDevComm));
  gin_types<ncclDevComm>(0);
  gin_context_count<ncclDevComm>(0);
  std::printf("\"requirements_size\": %zu, \"requirements_fields\": {", sizeof(reqs));
  FIELD(lsaMultimem); FIELD(barrierCount); FIELD(lsaBarrierCount); FIELD(railGinBarrierCount);
  FIELD(lsaLLA2ABlockCount); FIELD(lsaLLA2ASlotCount); FIELD(ginForceEnable);
  FIELD(ginContextCount); FIELD(ginSignalCount);
  optional_ginConnectionType<ncclDevCommRequirements>(0); optional_ginExclusiveContexts<ncclDevCommRequirements>(0);
  optional_ginQueueDepth<ncclDevCommRequirements>(0); optional_ginTrafficClass<ncclDevCommRequirements>(0);
  optional_worldGinBarrierCount<ncclDevCommRequirements>(0);
  optional_ginStrongSignalsRequired<ncclDevCommRequirements>(0);
  optional_ginVaSignalsRequired<ncclDevCommRequirements>(0); optional_ginCustomStride<ncclDevCommRequirements>(0);
  optional_ginType<ncclDevCommRequirements>(0);
  std::printf("\"ginCounterCount\": [%zu, %zu]}, \"requirements_initializer\": \"",
              offsetof(ncclDevCommRequirements, ginCounterCount), sizeof(int));
  const unsigned char* p = (const unsigned char*)&reqs;
  for (size_t i = 0; i < sizeof(reqs); i++) std::printf("%02x", p[i]);
  std::printf("\"}\n");
  return 0;
}
"""


def nvcc_path() -> str | None:
    """The nvcc to build with: ``$FLOWDSL_NVCC``, then ``$CUDA_HOME/bin/nvcc``, then ``PATH``."""
    for cand in (os.environ.get("FLOWDSL_NVCC"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.exists(cand):
            return cand
    return shutil.which("nvcc")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_digest(prebuilt_dir: Path = PREBUILT_DIR, sources=SOURCES) -> dict[str, str]:
    """sha256 of each support-library source (or of ``sources``), as recorded in the manifest."""
    return {name: _sha256(prebuilt_dir / name) for name in sources}


def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def compile_ltoir(include_dir: Path, arch: str, out: Path, prebuilt_dir: Path = PREBUILT_DIR, *,
                  source: str = "src/flowdsl_support.cu", nvcc: str | None = None, defines=()) -> None:
    """Compile the support library (or ``source``) for ``arch`` against the NCCL headers in ``include_dir``."""
    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        raise SupportLibraryError(
            "Cannot build the flowdsl support library: nvcc was not found. "
            "Install the CUDA toolkit (or set FLOWDSL_NVCC), or install an NCCL release "
            f"that has a prebuilt build: nvidia-nccl-cu13=={' or =='.join(SUPPORTED_VERSIONS)}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, "-std=c++17", "-O3", "-rdc=true", "-dlto", "--ltoir", f"-arch={arch}", *defines,
           "-I", str(prebuilt_dir / "include"), "-I", str(include_dir),
           str(prebuilt_dir / source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SupportLibraryError(f"Cannot build the flowdsl support library for {arch}:\n"
                                  f"{' '.join(cmd)}\n{proc.stderr}")


def defined_symbols(include_dir: Path, arch: str, prebuilt_dir: Path = PREBUILT_DIR, *,
                    source: str = "src/flowdsl_support.cu", nvcc: str | None = None, defines=()) -> list[str]:
    """The functions the support source defines against these headers (read after preprocessing).

    LTO-IR cannot be inspected and a full PTX build of the library takes minutes, so the
    build preprocesses the same source with the same headers and records the defined
    ``flowdsl_*`` functions in the manifest (the support code has no arch-specific
    definitions; ``arch`` is passed for the record).
    """
    out = subprocess.run([nvcc or nvcc_path(), "-std=c++17", "-E", "-x", "cu", f"-arch={arch}", *defines,
                          "-I", str(prebuilt_dir / "include"), "-I", str(include_dir),
                          str(prebuilt_dir / source)],
                         check=True, capture_output=True, text=True).stdout
    return sorted(set(re.findall(r"\b(flowdsl_\w+)\s*\([^;{}]*\)\s*\{", out)))


_BACKENDS_PROGRAM = "#include <nccl_device.h>\n" + "".join(
    f"#ifdef NCCL_GIN_{b.name}_ENABLE\nflowdsl_gin_backend {b.option}\n#endif\n" for b in GinBackend)


def gin_backends_in(include_dir: Path, nvcc: str | None = None) -> tuple[GinBackend, ...]:
    """The GIN backends whose device code the NCCL headers in ``include_dir`` have (each has a
    ``NCCL_GIN_<BACKEND>_ENABLE`` switch; 2.28 has the proxy and GDAKI)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "backends.cu"
        src.write_text(_BACKENDS_PROGRAM)
        out = subprocess.run([nvcc or nvcc_path(), "-std=c++17", "-E", "-x", "cu", "-I", str(include_dir), str(src)],
                             check=True, capture_output=True, text=True).stdout
    return tuple(GinBackend.from_option(name) for name in re.findall(r"^flowdsl_gin_backend (\w+)", out, re.M))


def gin_defines(backend: GinBackend | None, available) -> list[str]:
    """nvcc flags that leave only ``backend``'s device code in NCCL's GIN dispatch (None: every backend)."""
    return [] if backend is None else [f"-DNCCL_GIN_{b.name}_ENABLE=0" for b in available if b != backend]


def gin_build_name(arch: str, backend: GinBackend | None) -> str:
    """File stem of a GIN build: ``sm_90-gin`` (every backend) or ``sm_90-gin-proxy``."""
    return f"{arch}-gin" if backend is None else f"{arch}-gin-{backend.option}"


def read_layout(include_dir: Path) -> dict:
    """Struct sizes, requirement-field offsets and the requirements initializer of an ABI."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise SupportLibraryError("Cannot read the NCCL device ABI layout: nvcc was not found")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "layout.cu"
        exe = Path(tmp) / "layout"
        src.write_text(_LAYOUT_PROGRAM)
        subprocess.run([nvcc, "-std=c++17", "-I", str(include_dir), str(src), "-o", str(exe)],
                       check=True, capture_output=True, text=True)
        return json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


def _fetch_headers(version: str, workdir: Path) -> tuple[Path, str]:
    """Download the exact nvidia-nccl-cu13 wheel; return (include dir, wheel sha256)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_18_x86_64",
                    "-d", str(workdir), f"nvidia-nccl-cu13=={version}"], check=True)
    wheel = next(workdir.glob(f"nvidia_nccl_cu13-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("nvidia/nccl/include/"):
                zf.extract(name, workdir)
    return workdir / "nvidia" / "nccl" / "include", _sha256(wheel)


def build_all(prebuilt_dir: Path = PREBUILT_DIR, versions=SUPPORTED_VERSIONS, archs=ARCHS) -> dict:
    """Build every (version, arch) into ``prebuilt/build`` and write the manifest."""
    nvcc = nvcc_path()
    manifest = {
        "generator": "python -m flowdsl.runtime.support_build --all",
        "nvcc": _nvcc_version(nvcc) if nvcc else None,
        "sources": source_digest(prebuilt_dir),
        "abis": {},
    }
    for version in versions:
        with tempfile.TemporaryDirectory() as tmp:
            include_dir, wheel_sha = _fetch_headers(version, Path(tmp))
            backends = gin_backends_in(include_dir)
            entry = {"wheel": f"nvidia-nccl-cu13=={version}", "wheel_sha256": wheel_sha,
                     "layout": read_layout(include_dir), "builds": {},
                     "gin": {"backends": [b.option for b in backends], "builds": {}}}
            for arch in archs:
                rel = Path("build") / f"nccl-{version}" / f"{arch}.ltoir"
                compile_ltoir(include_dir, arch, prebuilt_dir / rel, prebuilt_dir)
                entry["builds"][arch] = {"file": str(rel), "sha256": _sha256(prebuilt_dir / rel),
                                         "symbols": defined_symbols(include_dir, arch, prebuilt_dir)}
                print(f"built {rel}", flush=True)
                for backend in (None, *backends):
                    rel = Path("build") / f"nccl-{version}" / f"{gin_build_name(arch, backend)}.ltoir"
                    defines = gin_defines(backend, backends)
                    compile_ltoir(include_dir, arch, prebuilt_dir / rel, prebuilt_dir, source=GIN_SOURCE,
                                  defines=defines)
                    entry["gin"]["builds"].setdefault("all" if backend is None else backend.option, {})[arch] = {
                        "file": str(rel), "sha256": _sha256(prebuilt_dir / rel),
                        "symbols": defined_symbols(include_dir, arch, prebuilt_dir, source=GIN_SOURCE,
                                                   defines=defines)}
                    print(f"built {rel}", flush=True)
        manifest["abis"][version] = entry
    previous = _read_manifest(prebuilt_dir)
    if "cft" in previous:  # built by build_cft with another toolkit: kept as it is
        manifest["cft"] = previous["cft"]
    _write_manifest(prebuilt_dir, manifest)
    return manifest


_CFT_LAYOUT_PROGRAM = r"""
#include <cstdio>
#include <cstddef>
#include <nccl_device.h>
#define FIELD(f) std::printf("\"%s\": [%zu, %zu]", #f, offsetof(ncclDevCommRequirements, f), \
                             sizeof(((ncclDevCommRequirements*)0)->f))
int main() { std::printf("{"); FIELD(cftCaps); std::printf(", "); FIELD(cftBarrierCount); std::printf("}\n"); }
"""


def read_cft_fields(include_dir: Path, nvcc: str) -> dict:
    """Offsets and sizes of the CFT fields of ``ncclDevCommRequirements`` (NCCL >= 2.31)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "cft_layout.cu", Path(tmp) / "cft_layout"
        src.write_text(_CFT_LAYOUT_PROGRAM)
        subprocess.run([nvcc, "-std=c++17", "-I", str(include_dir), str(src), "-o", str(exe)],
                       check=True, capture_output=True, text=True)
        return json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


def _read_manifest(prebuilt_dir: Path) -> dict:
    path = prebuilt_dir / "build" / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _write_manifest(prebuilt_dir: Path, manifest: dict) -> None:
    (prebuilt_dir / "build" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def cft_toolkit_dir() -> Path:
    """Where the CUDA 13.3 compiler for CFT builds is installed (``$FLOWDSL_CFT_TOOLKIT``)."""
    root = os.environ.get("FLOWDSL_CFT_TOOLKIT")
    if root:
        return Path(root)
    cache = os.environ.get("FLOWDSL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "flowdsl")
    return Path(cache) / "cuda-13.3"


def cft_nvcc_path() -> str | None:
    """The nvcc for CFT builds: ``$FLOWDSL_CFT_NVCC``, else the one :func:`install_cft_toolkit` installed."""
    cand = os.environ.get("FLOWDSL_CFT_NVCC") or str(cft_toolkit_dir() / "nvidia" / "cu13" / "bin" / "nvcc")
    return cand if os.path.exists(cand) else None


def install_cft_toolkit(prefix: Path | None = None) -> str:
    """Install the pinned CUDA 13.3 compiler wheels (:data:`CFT_TOOLKIT`) into ``prefix``; return its nvcc."""
    prefix = prefix or cft_toolkit_dir()
    nvcc = prefix / "nvidia" / "cu13" / "bin" / "nvcc"
    if not nvcc.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(prefix)]
                       + [f"{name}=={version}" for name, version in CFT_TOOLKIT.items()], check=True)
    return str(nvcc)


def build_cft(prebuilt_dir: Path = PREBUILT_DIR, versions=CFT_VERSIONS, archs=CFT_ARCHS,
              headers: Path | None = None) -> dict:
    """Build the CFT library for each (version, arch) and record it under the manifest's ``"cft"`` key.

    Args:
        headers: NCCL include dir to use instead of downloading the wheel (one version only).
    """
    nvcc = cft_nvcc_path() or install_cft_toolkit()
    entry = {"generator": "python -m flowdsl.runtime.support_build --cft", "nvcc": _nvcc_version(nvcc),
             "toolkit": dict(CFT_TOOLKIT), "sources": source_digest(prebuilt_dir, CFT_SOURCES), "abis": {}}
    for version in versions:
        with tempfile.TemporaryDirectory() as tmp:
            include_dir = headers if headers is not None else _fetch_headers(version, Path(tmp))[0]
            builds = {}
            for arch in archs:
                rel = Path("build") / f"nccl-{version}" / f"{arch}-cft.ltoir"
                compile_ltoir(include_dir, arch, prebuilt_dir / rel, prebuilt_dir, source=CFT_SOURCES[0], nvcc=nvcc)
                builds[arch] = {"file": str(rel), "sha256": _sha256(prebuilt_dir / rel),
                                "symbols": defined_symbols(include_dir, arch, prebuilt_dir, source=CFT_SOURCES[0],
                                                           nvcc=nvcc)}
                print(f"built {rel}", flush=True)
            fields = read_cft_fields(include_dir, nvcc)
        entry["abis"][version] = {"requirements_fields": fields, "builds": builds}
    manifest = _read_manifest(prebuilt_dir)
    manifest["cft"] = entry
    _write_manifest(prebuilt_dir, manifest)
    return entry


def installed_include_dir() -> Path | None:
    """The include dir of the installed ``nvidia-nccl-cu13`` wheel, if any."""
    try:
        import nvidia.nccl  # noqa: PLC0415
    except ImportError:
        return None
    for base in getattr(nvidia.nccl, "__path__", []):
        inc = Path(base) / "include"
        if (inc / "nccl_device.h").exists():
            return inc
    return None


def header_version_code(include_dir: Path) -> int:
    """``NCCL_VERSION_CODE`` of the headers in ``include_dir`` (e.g. 22809)."""
    match = re.search(r"#define\s+NCCL_VERSION_CODE\s+(\d+)", (include_dir / "nccl.h").read_text())
    if match is None:
        raise SupportLibraryError(f"Cannot read the NCCL version of {include_dir / 'nccl.h'}")
    return int(match.group(1))


def build_for_installed(version: str, arch: str, cache_dir: Path, gin: str | None = None) -> tuple[Path, dict]:
    """Build at first use for a loaded NCCL without a checked-in build.

    Uses the headers of the installed ``nvidia-nccl-cu13`` wheel when they are of
    the same release as the loaded library; the result is cached under ``cache_dir``.
    ``gin``: build the GIN library instead, with every backend (``"all"``) or one
    (``"proxy"``, ...; a backend these headers lack is a RuntimeError).
    """
    include_dir = installed_include_dir()
    needed = f"Install nvidia-nccl-cu13=={version} (its headers must match the loaded libnccl), " \
             f"or use a release with a prebuilt build: {', '.join(SUPPORTED_VERSIONS)}"
    if include_dir is None:
        raise SupportLibraryError(f"Cannot build the flowdsl support library for NCCL {version}: "
                                  f"no NCCL headers are installed. {needed}")
    major, minor, patch = (int(x) for x in version.split("."))
    found = header_version_code(include_dir)
    if found != major * 10000 + minor * 100 + patch:
        raise SupportLibraryError(f"Cannot build the flowdsl support library for NCCL {version}: the installed "
                                  f"headers are of NCCL {found // 10000}.{found // 100 % 100}.{found % 100}. {needed}")
    layout_path = cache_dir / f"nccl-{version}" / "layout.json"
    if not layout_path.exists():
        layout = read_layout(include_dir)
        layout_path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(layout_path, json.dumps(layout).encode())
    source, defines, name = "src/flowdsl_support.cu", [], arch
    if gin is not None:
        backends = installed_gin_backends(version, include_dir, cache_dir)
        backend = None if gin == "all" else GinBackend.from_option(gin)
        if gin != "all" and backend not in backends:
            raise SupportLibraryError(f"Cannot build the flowdsl GIN library for backend {gin}: the headers of NCCL "
                                      f"{version} have {', '.join(b.option for b in backends) or 'no GIN backend'}")
        source, defines, name = GIN_SOURCE, gin_defines(backend, backends), gin_build_name(arch, backend)
    out = cache_dir / f"nccl-{version}" / f"{name}.ltoir"
    if not out.exists():
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        compile_ltoir(include_dir, arch, tmp, source=source, defines=defines)
        os.replace(tmp, out)
    return out, json.loads(layout_path.read_text())


def installed_gin_backends(version: str, include_dir: Path, cache_dir: Path) -> tuple[GinBackend, ...]:
    """:func:`gin_backends_in` of the installed headers of ``version``, remembered under ``cache_dir``."""
    path = cache_dir / f"nccl-{version}" / "gin_backends.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(path, json.dumps([b.option for b in gin_backends_in(include_dir)]).encode())
    return tuple(GinBackend.from_option(name) for name in json.loads(path.read_text()))


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``path`` so that readers (other ranks) see all of it or none of it."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="build every supported (NCCL, arch)")
    parser.add_argument("--version", action="append", help="only this NCCL release (repeatable)")
    parser.add_argument("--cft", action="store_true",
                        help="build the CFT library (installs the pinned CUDA 13.3 nvcc into $FLOWDSL_CFT_TOOLKIT)")
    parser.add_argument("--headers", type=Path, help="with --cft and one --version: use these NCCL headers")
    args = parser.parse_args(argv)
    if not (args.all or args.version or args.cft):
        parser.error("say --all, --cft or --version X")
    if args.cft:
        build_cft(versions=tuple(args.version) if args.version else CFT_VERSIONS, headers=args.headers)
        return 0
    build_all(versions=tuple(args.version) if args.version else SUPPORTED_VERSIONS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
