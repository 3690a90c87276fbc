"""Building the support library (``prebuilt/``) for an NCCL device ABI and an arch.

The checked-in builds are made by ``prebuilt/build.sh``, which runs this module
with ``--all``: for each supported NCCL release it downloads that exact
``nvidia-nccl-cu13`` wheel for its headers, compiles
``prebuilt/src/flowdsl_support.cu`` to LTO-IR for each arch with nvcc, reads
the host-side struct layouts the runtime needs (``ncclDevComm`` size,
``ncclDevCommRequirements`` field offsets and initializer), and writes
``prebuilt/build/manifest.json``. At run time, a loaded NCCL without a
checked-in build gets one built at first use from its installed headers
(:func:`build_for_installed`), cached on disk.

Contents: :data:`SUPPORTED_VERSIONS`, :data:`ARCHS`, :func:`source_digest`,
:func:`compile_ltoir`, :func:`read_layout`, :func:`build_all`,
:func:`build_for_installed`, :func:`installed_include_dir`.
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

__all__ = [
    "SUPPORTED_VERSIONS", "ARCHS", "PREBUILT_DIR", "source_digest", "compile_ltoir", "read_layout",
    "build_all", "build_for_installed", "installed_include_dir", "nvcc_path", "header_version_code",
    "defined_symbols",
]

#: NCCL releases with a checked-in build: what PyTorch 2.11 pins, and the newest.
SUPPORTED_VERSIONS = ("2.28.9", "2.32.3")
#: Targets of every build. sm_100 also carries CFT once it lands.
ARCHS = ("sm_80", "sm_90", "sm_100")

PREBUILT_DIR = Path(os.environ.get("FLOWDSL_PREBUILT_DIR", Path(__file__).resolve().parents[2] / "prebuilt"))
SOURCES = ("src/flowdsl_support.cu", "include/flowdsl_support.h")

# Host program that prints what the runtime must know about the ABI's structs.
_LAYOUT_PROGRAM = r"""
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <nccl_device.h>
#define FIELD(f) std::printf("\"%s\": [%zu, %zu],", #f, offsetof(ncclDevCommRequirements, f), \
                             sizeof(((ncclDevCommRequirements*)0)->f))
int main() {
  // Static storage, so that padding bytes are zero and the manifest is reproducible.
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  static ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  static ncclDevCommRequirements reqs;
#endif
  std::printf("{\"version_code\": %d, \"dev_comm_size\": %zu, \"dev_comm_align\": %zu, ",
              NCCL_VERSION_CODE, sizeof(ncclDevComm), alignof(ncclDevComm));
  std::printf("\"requirements_size\": %zu, \"requirements_fields\": {", sizeof(reqs));
  FIELD(lsaMultimem); FIELD(barrierCount); FIELD(lsaBarrierCount); FIELD(railGinBarrierCount);
  FIELD(lsaLLA2ABlockCount); FIELD(lsaLLA2ASlotCount); FIELD(ginForceEnable);
  FIELD(ginContextCount); FIELD(ginSignalCount);
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


def source_digest(prebuilt_dir: Path = PREBUILT_DIR) -> dict[str, str]:
    """sha256 of each support-library source, as recorded in the manifest."""
    return {name: _sha256(prebuilt_dir / name) for name in SOURCES}


def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def compile_ltoir(include_dir: Path, arch: str, out: Path, prebuilt_dir: Path = PREBUILT_DIR) -> None:
    """Compile the support library for ``arch`` against the NCCL headers in ``include_dir``."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError(
            "Cannot build the flowdsl support library: nvcc was not found. "
            "Install the CUDA toolkit (or set FLOWDSL_NVCC), or install an NCCL release "
            f"that has a prebuilt build: nvidia-nccl-cu13=={' or =='.join(SUPPORTED_VERSIONS)}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, "-std=c++17", "-O3", "-rdc=true", "-dlto", "--ltoir", f"-arch={arch}",
           "-I", str(prebuilt_dir / "include"), "-I", str(include_dir),
           str(prebuilt_dir / "src" / "flowdsl_support.cu"), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"Cannot build the flowdsl support library for {arch}:\n"
                           f"{' '.join(cmd)}\n{proc.stderr}")


def defined_symbols(include_dir: Path, arch: str, prebuilt_dir: Path = PREBUILT_DIR) -> list[str]:
    """The functions the support source defines against these headers (read after preprocessing).

    LTO-IR cannot be inspected and a full PTX build of the library takes minutes, so the
    build preprocesses the same source with the same headers and records the defined
    ``flowdsl_*`` functions in the manifest (the support code has no arch-specific
    definitions; ``arch`` is passed for the record).
    """
    out = subprocess.run([nvcc_path(), "-std=c++17", "-E", "-x", "cu", f"-arch={arch}",
                          "-I", str(prebuilt_dir / "include"), "-I", str(include_dir),
                          str(prebuilt_dir / "src" / "flowdsl_support.cu")],
                         check=True, capture_output=True, text=True).stdout
    return sorted(set(re.findall(r"\b(flowdsl_\w+)\s*\([^;{}]*\)\s*\{", out)))


def read_layout(include_dir: Path) -> dict:
    """Struct sizes, requirement-field offsets and the requirements initializer of an ABI."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("Cannot read the NCCL device ABI layout: nvcc was not found")
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
            entry = {"wheel": f"nvidia-nccl-cu13=={version}", "wheel_sha256": wheel_sha,
                     "layout": read_layout(include_dir), "builds": {}}
            for arch in archs:
                rel = Path("build") / f"nccl-{version}" / f"{arch}.ltoir"
                compile_ltoir(include_dir, arch, prebuilt_dir / rel, prebuilt_dir)
                entry["builds"][arch] = {"file": str(rel), "sha256": _sha256(prebuilt_dir / rel),
                                         "symbols": defined_symbols(include_dir, arch, prebuilt_dir)}
                print(f"built {rel}", flush=True)
        manifest["abis"][version] = entry
    (prebuilt_dir / "build" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


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
        raise RuntimeError(f"Cannot read the NCCL version of {include_dir / 'nccl.h'}")
    return int(match.group(1))


def build_for_installed(version: str, arch: str, cache_dir: Path) -> tuple[Path, dict]:
    """Build at first use for a loaded NCCL without a checked-in build.

    Uses the headers of the installed ``nvidia-nccl-cu13`` wheel when they are of
    the same release as the loaded library; the result is cached under ``cache_dir``.
    """
    include_dir = installed_include_dir()
    needed = f"Install nvidia-nccl-cu13=={version} (its headers must match the loaded libnccl), " \
             f"or use a release with a prebuilt build: {', '.join(SUPPORTED_VERSIONS)}"
    if include_dir is None:
        raise RuntimeError(f"Cannot build the flowdsl support library for NCCL {version}: "
                           f"no NCCL headers are installed. {needed}")
    major, minor, patch = (int(x) for x in version.split("."))
    found = header_version_code(include_dir)
    if found != major * 10000 + minor * 100 + patch:
        raise RuntimeError(f"Cannot build the flowdsl support library for NCCL {version}: the installed "
                           f"headers are of NCCL {found // 10000}.{found // 100 % 100}.{found % 100}. {needed}")
    layout_path = cache_dir / f"nccl-{version}" / "layout.json"
    out = cache_dir / f"nccl-{version}" / f"{arch}.ltoir"
    if not layout_path.exists():
        layout = read_layout(include_dir)
        layout_path.parent.mkdir(parents=True, exist_ok=True)
        layout_path.write_text(json.dumps(layout))
    if not out.exists():
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        compile_ltoir(include_dir, arch, tmp)
        os.replace(tmp, out)
    return out, json.loads(layout_path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="build every supported (NCCL, arch)")
    parser.add_argument("--version", action="append", help="only this NCCL release (repeatable)")
    args = parser.parse_args(argv)
    if not (args.all or args.version):
        parser.error("say --all or --version X")
    build_all(versions=tuple(args.version) if args.version else SUPPORTED_VERSIONS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
