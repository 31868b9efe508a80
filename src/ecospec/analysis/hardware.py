"""GPU profiles for the roofline latency model (`ecospec.analysis.latency.modeled_step`): peak HBM bandwidth per GPU
from NVIDIA's datasheets, plus a fixed per-step overhead (0 until fitted from measured records).

A model that `device_map="auto"` spreads over several GPUs runs its layers one GPU after another, so one GPU's
bandwidth bounds a pass; for tensor parallelism over n GPUs use ``replace(profile, hbm_bytes_per_s=n * ...)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    hbm_bytes_per_s: float  # peak HBM bandwidth of one GPU
    overhead_s: float = 0.0  # fixed time per forward pass (kernel launches, host work); see cost.fit_overhead
    device_pattern: str = ""  # regex matched against torch.cuda.get_device_name() (record['env']['hardware'])
    source: str = ""

    def matches(self, device_name: str) -> bool:
        """Whether a CUDA device name (as stored in result records) is this GPU."""
        return bool(self.device_pattern) and re.search(self.device_pattern, device_name) is not None


HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in (
        # "NVIDIA H100 80GB HBM3" is the SXM part; PCIe (2.0 TB/s) and NVL (3.9 TB/s) report other names.
        Hardware(
            "H100",
            3.35e12,
            device_pattern=r"H100.*HBM3$",
            source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 3.35 TB/s (nvidia.com/en-us/data-center/h100)",
        ),
        Hardware(
            "H200",
            4.8e12,
            device_pattern=r"H200",
            source="NVIDIA H200 Tensor Core GPU datasheet, SXM and NVL: 4.8 TB/s (nvidia.com/en-us/data-center/h200)",
        ),
        Hardware(
            "B200",
            8.0e12,
            device_pattern=r"B200",
            source="NVIDIA DGX B200 datasheet, 64 TB/s over 8 GPUs (nvidia.com/en-us/data-center/dgx-b200)",
        ),
    )
}
