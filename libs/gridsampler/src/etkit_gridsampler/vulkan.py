"""The grid sampler's Vulkan side: the device it runs on."""

from __future__ import annotations

from etkit_gridsampler._vulkan_compute import (
    DeviceInfo,
    VulkanUnavailableError,
    compile_glsl,
    default_device,
)

__all__ = ["DeviceInfo", "VulkanUnavailableError", "compile_glsl", "device_info", "is_available"]


def is_available() -> bool:
    """True when a Vulkan device with a compute queue can be opened in this process."""
    try:
        default_device()
    except VulkanUnavailableError:
        return False
    return True


def device_info() -> DeviceInfo:
    """Name, API version and driver of the Vulkan device the kernels run on. Raises
    ``VulkanUnavailableError`` when there is none."""
    return default_device().info()
