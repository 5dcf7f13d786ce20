"""The GPU datasheets, in one table (standard library only): each GPU's memory and its dense peak
FLOP/s per math mode, found by the name torch.cuda.get_device_name() reports or a Slurm gres type.

The launcher reads the memory (the fit before launch: launcher/plan/fit.py, the Slurm checks);
the ranks read the peaks (MFU: jobs/peaks.py). A row is a regular expression over the lower-cased
name, most specific first; a lookup takes the first row that matches and knows the figure asked,
so a row may carry one figure only. Matching follows torchtitan's get_peak_flops: family first
("h100"), then the variant ("nvl", "pcie"), else the SXM part, because the SXM H100 reports itself
as "NVIDIA H100 80GB HBM3" with no "SXM". A GPU not listed gets no figure: never another GPU's.
Memory is the total nvidia-smi / rocm-smi report (GiB); names that do not say the size (a100,
v100) are not guessed. Peaks are vendor datasheets without sparsity; "tf32": None marks a GPU
without TF32 units (fp32 math always).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_T = 1e12
Peaks = dict[str, "float | None"]
_H100_SXM: Peaks = {"fp32": 67 * _T, "tf32": 494.7 * _T, "bf16": 989.4 * _T, "fp16": 989.4 * _T}
_H100_PCIE: Peaks = {"fp32": 51 * _T, "tf32": 378 * _T, "bf16": 756 * _T, "fp16": 756 * _T}
_H100_NVL: Peaks = {"fp32": 60 * _T, "tf32": 417.5 * _T, "bf16": 835 * _T, "fp16": 835 * _T}
_A100: Peaks = {"fp32": 19.5 * _T, "tf32": 156 * _T, "bf16": 312 * _T, "fp16": 312 * _T}
_A10: Peaks = {"fp32": 31.2 * _T, "tf32": 62.5 * _T, "bf16": 125 * _T, "fp16": 125 * _T}
_V100: Peaks = {"fp32": 15.7 * _T, "tf32": None, "fp16": 125 * _T}  # SXM2
_MI300: Peaks = {"fp32": 163.4 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T}
_WORD = r"(?<![a-z0-9])"  # a name's word starts here ("l4" is not "gl4"): "-" and "_" separate words


@dataclass(frozen=True)
class Gpu:
    pattern: str  # over the lower-cased device name or gres type
    mem_gib: float | None
    peaks: Peaks | None


GPUS: tuple[Gpu, ...] = (
    Gpu(r"gh200", None, _H100_SXM),  # Grace Hopper: the H100 SXM's tensor cores (before "h200")
    Gpu(r"h200.*nvl", 140.4, _H100_NVL),
    Gpu(r"h200", 140.4, _H100_SXM),  # same compute as the H100 SXM, more memory
    Gpu(r"h100.*nvl", 93.6, _H100_NVL),
    Gpu(r"h100.*pcie", 79.6, _H100_PCIE),
    Gpu(r"h100", 79.6, _H100_SXM),  # "NVIDIA H100 80GB HBM3" = SXM5
    Gpu(r"h800.*pcie", None, _H100_PCIE),
    Gpu(r"h800", None, _H100_SXM),  # export H100: same compute, less NVLink
    Gpu(_WORD + r"h20(?![0-9])", None, {"fp32": 44 * _T, "tf32": 74 * _T, "bf16": 148 * _T, "fp16": 148 * _T}),
    Gpu(r"b200", None, {"bf16": 2250 * _T, "fp16": 2250 * _T}),  # torchtitan's figure; fp32/tf32 not listed
    Gpu(r"a100.*80", 80.0, _A100),
    Gpu(r"a100.*40", 40.0, _A100),
    Gpu(r"a100", None, _A100),
    Gpu(r"a800", None, _A100),
    Gpu(_WORD + r"a10g(?![0-9])", 22.5, _A10),  # AWS: A10 figures
    Gpu(_WORD + r"a10(?![0-9a-z])", 22.5, _A10),
    Gpu(_WORD + r"a30(?![0-9])", None, {"fp32": 10.3 * _T, "tf32": 82 * _T, "bf16": 165 * _T, "fp16": 165 * _T}),
    Gpu(_WORD + r"a40(?![0-9])", 45.0, None),
    Gpu(_WORD + r"l40s(?![0-9])", 45.0, {"fp32": 91.6 * _T, "tf32": 183 * _T, "bf16": 362.05 * _T, "fp16": 362.05 * _T}),
    Gpu(_WORD + r"l40(?![0-9a-z])", 45.0, {"fp32": 90.5 * _T, "tf32": 90.5 * _T, "bf16": 181 * _T, "fp16": 181 * _T}),
    Gpu(_WORD + r"l4(?![0-9a-z])", 22.5, {"fp32": 30.3 * _T, "tf32": 60 * _T, "bf16": 121 * _T, "fp16": 121 * _T}),
    Gpu(r"v100s", None, {"fp32": 16.4 * _T, "tf32": None, "fp16": 130 * _T}),
    Gpu(r"v100.*pcie", None, {"fp32": 14 * _T, "tf32": None, "fp16": 112 * _T}),
    Gpu(r"v100.*32", 32.0, _V100),
    Gpu(r"v100.*16", 16.0, _V100),
    Gpu(r"v100", None, _V100),
    Gpu(_WORD + r"t4(?![0-9])", 15.0, {"fp32": 8.1 * _T, "tf32": None, "fp16": 65 * _T}),
    Gpu(r"mi300x", 192.0, _MI300),
    Gpu(r"mi325x", None, _MI300),
)


def _first(name: str, figure: str):
    lowered = name.lower()
    return next((getattr(g, figure) for g in GPUS if getattr(g, figure) is not None and re.search(g.pattern, lowered)),
                None)


def gpu_mem_gib_of(name: str) -> float | None:
    """The memory (GiB) of a GPU named ``name`` (a gres type such as ``h100`` or a device name such
    as ``NVIDIA A100-SXM4-80GB``), or None when the name does not say it."""
    return _first(name, "mem_gib")


def device_peaks(device_name: str) -> Peaks | None:
    """The dense peak FLOP/s per math mode of ``device_name``, or None for a GPU not listed."""
    return _first(device_name, "peaks")
