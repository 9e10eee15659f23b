"""Forwarding module, to be removed: which kernels carry the device-side half is :mod:`ds4lab.executor.kernel_pdl`."""

from ..executor.kernel_pdl import (ENTRY_MACRO, MissingDeviceHalf, default_kernels_dir, device_half,  # noqa: F401
                                   kernel_bodies, require_device_half, waits_first)
