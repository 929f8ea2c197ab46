"""The same kernels compiled the three ways TVM 0.27 users meet, and with tvm-dsm's options.

Here (CPU, full TVM, nvcc and cuda-bindings):
    python -m tvm_dsm.gpu.picks timing --out .gpu/paths/kernels
    python -m tvm_dsm.gpu.compile_paths precompile .gpu/paths/kernels/picks_timing --bins .gpu/paths/bins
On the GPU machine (runtime-only TVM + torch):
    python -m tvm_dsm.gpu.compile_paths measure .gpu/paths/kernels/picks_timing --bins .gpu/paths/bins --out raw.json
Here again:
    python -m tvm_dsm.gpu.compile_paths report raw.json --fixed OPTIONS_KEY --out compile_paths.json

Paths (one binary each per kernel): ``nvrtc`` = TVM's default callback (``compile_cuda(...,
compiler="nvrtc")``; on the device also recompiled with the device's own NVRTC, ``nvrtc_device``),
``nvcc_mode`` = ``TVM_CUDA_COMPILE_MODE=nvcc`` (TVM's nvcc fatbin), ``bundle_cubin`` = the bundle's
``nvcc -cubin -O3``, and ``dsm_<compiler>_<fm|nofm>_<r5|r10>``: :mod:`tvm_dsm.compile_options`
through nvcc or NVRTC with and without fast math, at ptxas register-usage level 5 (default) or 10.
Each distinct binary of a kernel is checked (fresh inputs against float64) and timed under CUDA
graph replay, twice, in opposite orders.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from ..bench.results import GRAPH_TIMING

ARCH = "sm_90a"
#: tvm-dsm option candidates: (compiler, fast_math, register_usage_level)
CANDIDATES = [(c, fm, r) for c in ("nvcc", "nvrtc") for fm in (True, False) for r in (None, 10)]


def candidate_key(compiler: str, fast_math: bool, level: int | None) -> str:
    return f"dsm_{compiler}_{'fm' if fast_math else 'nofm'}_{'r10' if level else 'r5'}"


def _bundle_cubin(code: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d, "k.cu"), Path(d, "k.cubin")
        src.write_text(code)
        subprocess.run(["nvcc", "-cubin", "-O3", f"-gencode=arch=compute_{ARCH[3:]},code={ARCH}", "-o", str(out),
                        str(src)], check=True, capture_output=True)
        return out.read_bytes()


def _tvm_nvrtc(code: str) -> bytes:
    from tvm.support import nvcc as tvm_nvcc

    from ..compile_options import _cuda_path_with_headers

    root = _cuda_path_with_headers()
    if root:
        os.environ.setdefault("CUDA_PATH", root)
    return bytes(tvm_nvcc.compile_cuda(code, target_format="cubin", arch=ARCH, compiler="nvrtc"))


def _tvm_nvcc_mode(code: str) -> bytes:
    import tvm
    from tvm.support import nvcc as tvm_nvcc

    with tvm.target.Target({"kind": "cuda", "arch": ARCH}):
        return bytes(tvm_nvcc.compile_cuda(code, target_format="fatbin", compiler="nvcc"))


def path_compilers() -> dict:
    from ..compile_options import CudaCompileOptions, compile_cuda

    paths = {"nvrtc": _tvm_nvrtc, "nvcc_mode": _tvm_nvcc_mode, "bundle_cubin": _bundle_cubin}
    for compiler, fm, level in CANDIDATES:
        options = CudaCompileOptions(fast_math=fm, register_usage_level=level)
        paths[candidate_key(compiler, fm, level)] = (
            lambda code, o=options, c=compiler: compile_cuda(code, ARCH, o, c))
    return paths


def cubin_info(data: bytes) -> dict:
    """{kernel: {"regs", "frame_bytes", "text_bytes"}} of a cubin: registers and stack frame from
    its ``.nv.info`` attributes (EIATTR_REGCOUNT 0x2f, EIATTR_FRAME_SIZE 0x11), the machine code's
    size from ``.text.<kernel>``; {} for what is not an ELF."""
    import struct

    if data[:4] != b"\x7fELF":
        return {}
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, align, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table, offset):
        base = sections[table][4]
        return data[base + offset:data.index(b"\0", base + offset)].decode()

    names = [string(shstrndx, s[0]) for s in sections]
    out = {n[6:]: {"regs": None, "frame_bytes": None, "text_bytes": s[5]}
           for n, s in zip(names, sections) if n.startswith(".text.")}
    symtab = next((i for i, n in enumerate(names) if n == ".symtab"), None)
    symbols = {}
    if symtab is not None:
        _, _, _, _, off, size, link, _, _, _ = sections[symtab]
        for k in range(size // 24):
            symbols[k] = string(link, struct.unpack_from("<I", data, off + 24 * k)[0])
    for n, s in zip(names, sections):
        if n != ".nv.info":
            continue
        pos, end = s[4], s[4] + s[5]
        while pos + 2 <= end:
            fmt, attr = data[pos], data[pos + 1]
            if fmt == 0x04:  # EIFMT_SVAL: u16 size, then the value
                size, = struct.unpack_from("<H", data, pos + 2)
                if attr in (0x2F, 0x11) and size == 8:
                    sym, value = struct.unpack_from("<II", data, pos + 4)
                    kernel = out.get(symbols.get(sym, ""))
                    if kernel is not None:
                        kernel["regs" if attr == 0x2F else "frame_bytes"] = value
                pos += 4 + size
            elif fmt == 0x03:  # EIFMT_HVAL: u16 value
                pos += 4
            elif fmt == 0x02:  # EIFMT_BVAL
                pos += 4
            else:  # EIFMT_NVAL
                pos += 2
    return out


def fatbin_cubin(data: bytes) -> bytes | None:
    """The (uncompressed) ELF inside a fatbin, if there is one."""
    start = data.find(b"\x7fELF")
    return data[start:] if start >= 0 else None


#: The experiment beside the flags: two-warpgroup (256-thread) attention picks held at two CTAs
#: per SM (``__launch_bounds__(256, 2)``: at most 128 registers), whichever way they are compiled.
LAUNCH_BOUNDS_PATHS = ("nvrtc", "nvcc_mode", "bundle_cubin", "dsm_nvcc_fm_r5", "dsm_nvrtc_fm_r5")


def min_blocks_source(code: str) -> str | None:
    """``code`` with its 256-thread kernels declared ``__launch_bounds__(256, 2)``; None if it
    has none."""
    return code.replace("__launch_bounds__(256)", "__launch_bounds__(256, 2)") if "__launch_bounds__(256)" in code else None


def precompile(folder: Path, bins: Path, only: list[str] | None = None) -> dict:
    """Every path's binary of every kernel of ``folder``'s manifest, into ``bins`` with an index;
    for the two-warpgroup attention picks also ``lb_<path>``: the source with
    :func:`min_blocks_source` under :data:`LAUNCH_BOUNDS_PATHS`."""
    manifest = json.loads((folder / "manifest.json").read_text())
    bins.mkdir(parents=True, exist_ok=True)
    compilers = path_compilers()
    index = {}
    for kernel in manifest["kernels"]:
        name = kernel["name"]
        code = (folder / f"{name}.cu").read_text()
        index[name] = {"code_sha1": hashlib.sha1(code.encode()).hexdigest(), "paths": {}}
        jobs = [(path, fn, code) for path, fn in compilers.items()]
        bounded = min_blocks_source(code) if name.startswith("attention") and name.endswith("_w2") else None
        if bounded:
            jobs += [(f"lb_{path}", compilers[path], bounded) for path in LAUNCH_BOUNDS_PATHS]
        for path, compile_fn, code in jobs:
            if only and path not in only:
                continue
            t0 = time.time()
            data = compile_fn(code)
            sha = hashlib.sha1(data).hexdigest()[:16]
            (bins / f"{sha}.bin").write_bytes(data)
            elf = data if data[:4] == b"\x7fELF" else fatbin_cubin(data)
            info = cubin_info(elf) if elf else {}
            index[name]["paths"][path] = {"bin": f"{sha}.bin", "compile_s": round(time.time() - t0, 2),
                                          "kernels": info}
        regs = {p: "+".join(str(k["regs"]) for k in v["kernels"].values()) for p, v in index[name]["paths"].items()}
        print(name, regs, flush=True)
    (bins / "index.json").write_text(json.dumps(index, indent=1))
    return index


# ---------------------------------------------------------------------------------------------
# On the GPU machine


def _device_versions() -> dict:
    versions = {}
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        versions["nvcc"] = out.strip().splitlines()[-1]
    except OSError:
        versions["nvcc"] = "none"
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        versions["nvrtc"] = f"{major}.{minor}"
        import importlib.metadata as md

        for dist in ("cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13"):
            try:
                versions[dist] = md.version(dist)
            except md.PackageNotFoundError:
                pass
    except Exception as err:  # noqa: BLE001 - recorded, not fatal
        versions["nvrtc"] = f"unavailable: {err}"
    return versions


def measure(folder: Path, bins: Path, out: Path, rounds: int = 2, deadline_s: float = 420.0,
            only: list[str] | None = None, paths_only: list[str] | None = None) -> dict:
    import torch
    import tvm
    import tvm_ffi

    from ..bench.timing import graph_time_us, input_sets_for
    from .run import _random_inputs, verdict

    start = time.time()
    manifest = json.loads((folder / "manifest.json").read_text())
    index = json.loads((bins / "index.json").read_text())
    serving: dict = {"data": None, "calls": 0, "code_sha1": None}

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _serve(code, *_):
        serving["calls"] += 1
        serving["code_sha1"] = hashlib.sha1(code.encode()).hexdigest()
        return bytearray(serving["data"])

    device_nvrtc = {}
    versions = _device_versions()
    raw = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "versions": versions,
           "tvm": manifest["tvm"], "tvm_dsm": manifest["tvm_dsm"], "rounds": rounds, "rows": []}
    kernels = [k for k in manifest["kernels"] if not only or any(o in k["name"] for o in only)]
    rows = {}
    for kernel in kernels:
        name = kernel["name"]
        paths = {p: v for p, v in index[name]["paths"].items() if not paths_only or p in paths_only}
        # The device's own NVRTC through TVM's default path: what a user of this machine gets.
        code = (folder / f"{name}.cu").read_text()
        try:
            t0 = time.time()
            data = _tvm_nvrtc(code)
            sha = hashlib.sha1(data).hexdigest()[:16]
            device_nvrtc[sha] = data
            paths["nvrtc_device"] = {"bin": f"{sha}.bin", "compile_s": round(time.time() - t0, 2),
                                     "kernels": cubin_info(data),
                                     "same_as_here": f"{sha}.bin" == index[name]["paths"]["nvrtc"]["bin"]}
        except Exception as err:  # noqa: BLE001
            paths["nvrtc_device"] = {"error": str(err)[-500:]}
        rows[name] = {"name": name, "family": kernel["extra"].get("family"), "paths": paths, "binaries": {}}
        raw["rows"].append(rows[name])
    print(f"device NVRTC compiled in {time.time() - start:.0f} s", flush=True)
    # Rounds outside kernels: a deadline cuts the second round, not the last kernels.
    for r in range(rounds):
        for kernel in kernels:
            name = kernel["name"]
            row, entry = rows[name], index[name]
            unique = sorted({p["bin"] for p in row["paths"].values() if "bin" in p})
            sets = _random_inputs(kernel["args"], input_sets_for(kernel["bytes"]))
            wrapped = [[tvm_ffi.from_dlpack(t) for t in s] for s in sets]
            for binary in (unique if r % 2 == 0 else unique[::-1]):
                if time.time() - start > deadline_s:
                    row["truncated"] = True
                    break
                data = device_nvrtc.get(binary[:-4]) or (bins / binary).read_bytes()
                serving.update(data=data, calls=0)
                info = row["binaries"].setdefault(binary, {"us": []})
                faulthandler.dump_traceback_later(90, exit=True)  # a hang ends the run; the JSON stays
                try:
                    func = tvm.runtime.load_module(str(folder / kernel["lib"]))["main"]
                    if r == 0:
                        checked = verdict(func, kernel, trials=2)
                        info.update(ok=checked["ok"], rel_err=checked["rel_err"],
                                    written=checked["written_fraction"])
                    info["us"].append(graph_time_us(lambda i: func(*wrapped[i]), len(sets)))
                except Exception as err:  # noqa: BLE001
                    info["error"] = str(err)[-500:]
                faulthandler.cancel_dump_traceback_later()
                info["callback_calls"] = serving["calls"]
                info["code_matches_export"] = serving["code_sha1"] == entry["code_sha1"]
            out.write_text(json.dumps(raw, indent=1))
            times = {p: sum(row["binaries"][v["bin"]]["us"]) / len(row["binaries"][v["bin"]]["us"])
                     for p, v in row["paths"].items()
                     if "bin" in v and row["binaries"].get(v["bin"], {}).get("us")}
            print(f"[{r}] {name}", " ".join(f"{p}={t:.1f}" for p, t in times.items()), flush=True)
            del sets, wrapped
            torch.cuda.empty_cache()
    raw["seconds"] = round(time.time() - start, 1)
    out.write_text(json.dumps(raw, indent=1))
    return raw


# ---------------------------------------------------------------------------------------------
# Here again: the table


def _path_means(row: dict) -> dict:
    out = {}
    for path, entry in row["paths"].items():
        info = row["binaries"].get(entry.get("bin"), {})
        if info.get("us"):
            out[path] = round(sum(info["us"]) / len(info["us"]), 2)
    return out


def report(raw: dict, fixed: tuple[str, str], date: str, extras: dict | None = None) -> dict:
    """The suite JSON: per kernel the mean time of each path's binary over the rounds; ``extras``
    (label: raw of another run, e.g. another machine) add their means per path to each row."""
    nvcc_key, nvrtc_key = fixed
    columns = {"nvrtc": "nvrtc_device", "nvcc_mode": "nvcc_mode", "bundle_cubin": "bundle_cubin",
               "fixed_nvrtc": nvrtc_key, "fixed_nvcc_mode": nvcc_key}
    rows = []
    for row in raw["rows"]:
        def us(path):
            entry = row["paths"].get(path, {})
            info = row["binaries"].get(entry.get("bin"), {})
            return sum(info["us"]) / len(info["us"]) if info.get("us") else None

        times = {col: us(path) for col, path in columns.items()}
        if times["nvrtc"] is None:  # the device's NVRTC failed: the one built here (same version?)
            times["nvrtc"] = us("nvrtc")
        base = [t for c, t in times.items() if c in ("nvrtc", "nvcc_mode", "bundle_cubin") and t]
        fixed_t = [t for c, t in times.items() if c.startswith("fixed") and t]
        every = {p: us(p) for p in row["paths"]}
        ok = {p: row["binaries"].get(v.get("bin"), {}).get("ok") for p, v in row["paths"].items()}
        rel = {p: row["binaries"].get(v.get("bin"), {}).get("rel_err") for p, v in row["paths"].items()}
        regs = {p: "+".join(str(k["regs"]) for k in v.get("kernels", {}).values()) for p, v in row["paths"].items()}
        spreads = {b: (max(i["us"]) / min(i["us"]) - 1) for b, i in row["binaries"].items() if len(i.get("us", [])) > 1}
        rows.append({
            "name": row["name"], "family": row["family"],
            "paths": {c: round(t, 2) if t else None for c, t in times.items()},
            "spread": round(max(base) / min(base) - 1, 4) if base else None,
            "fixed_spread": round(max(fixed_t) / min(fixed_t) - 1, 4) if len(fixed_t) > 1 else None,
            "fixed_vs_best_base": round(max(fixed_t) / min(base) - 1, 4) if fixed_t and base else None,
            "all_paths_us": {p: round(t, 2) if t else None for p, t in every.items()},
            "ok": ok, "rel_err": rel, "regs": regs,
            "same_binary": {p: v.get("bin") for p, v in row["paths"].items()},
            "round_spread_max": round(max(spreads.values()), 4) if spreads else None,
            "other_runs": {label: _path_means(other) for label, extra in (extras or {}).items()
                           for other in extra["rows"] if other["name"] == row["name"]},
        })
    return {
        "suite": "compile_paths", "device": raw["device"], "date": date,
        "versions": {"tvm": raw["tvm"], "tvm_dsm": raw["tvm_dsm"], "torch": raw["torch"],
                     "cuda": raw["versions"].get("nvcc"), **{k: v for k, v in raw["versions"].items() if k != "nvcc"}},
        "timing": f"{GRAPH_TIMING} replays, mean of "
                  f"{raw['rounds']} rounds in opposite path orders; one process, one warm H100",
        "fixed": {"fixed_nvcc_mode": nvcc_key, "fixed_nvrtc": nvrtc_key},
        "paths_legend": {
            "nvrtc": "TVM default tvm_callback_cuda_compile: NVRTC cubin, --use_fast_math, ptxas --register-usage-level=10 (device's own NVRTC)",
            "nvcc_mode": "TVM_CUDA_COMPILE_MODE=nvcc: nvcc --fatbin -O3 --use_fast_math, ptxas --register-usage-level=10",
            "bundle_cubin": "shared/gpu/bundle callback: nvcc -cubin -O3 (no fast math, ptxas defaults)",
            "fixed_nvcc_mode": f"tvm_dsm.compile_options through nvcc ({nvcc_key})",
            "fixed_nvrtc": f"tvm_dsm.compile_options through NVRTC ({nvrtc_key})",
        },
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("precompile")
    p.add_argument("folder", type=Path)
    p.add_argument("--bins", type=Path, required=True)
    p.add_argument("--only", nargs="*")
    m = sub.add_parser("measure")
    m.add_argument("folder", type=Path)
    m.add_argument("--bins", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--deadline", type=float, default=420.0)
    m.add_argument("--only", nargs="*")
    m.add_argument("--paths", nargs="*", help="time only these paths (and nvrtc_device)")
    r = sub.add_parser("report")
    r.add_argument("raw", type=Path)
    r.add_argument("--fixed-nvcc", required=True)
    r.add_argument("--fixed-nvrtc", required=True)
    r.add_argument("--date", required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--extra", nargs="*", default=[], help="LABEL=RAW.json of other runs")
    args = parser.parse_args()
    if args.cmd == "precompile":
        precompile(args.folder, args.bins, args.only)
    elif args.cmd == "measure":
        measure(args.folder, args.bins, args.out, args.rounds, args.deadline, args.only, args.paths)
    else:
        extras = {e.split("=", 1)[0]: json.loads(Path(e.split("=", 1)[1]).read_text()) for e in args.extra}
        result = report(json.loads(args.raw.read_text()), (args.fixed_nvcc, args.fixed_nvrtc), args.date, extras)
        args.out.write_text(json.dumps(result, indent=1))
        for row in result["rows"]:
            print(f"{row['name'][:58]:58s} " + " ".join(f"{c}={t}" for c, t in row["paths"].items())
                  + f" spread={row['spread']} fixed_spread={row['fixed_spread']}")


if __name__ == "__main__":
    main()
