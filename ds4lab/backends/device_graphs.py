"""Forwarding module, to be removed: the device-graph contract is :mod:`ds4lab.executor.device_graphs`."""

from ..executor.device_graphs import (COND_KINDS, PREDECESSOR_RULES, CondHandle, DeviceGraphApi,  # noqa: F401
                                      can_build_device_graphs, check_kind, size_allowed)
