"""A small Vulkan compute runner on the ``vulkan`` (cffi) bindings: one device, storage buffers
in, storage buffers out, push constants, a dispatch. The grid-sampler's Vulkan kernel runs on it.
Pipelines are built once per shader and kept; ``ComputeDevice.prepare`` keeps a dispatch's
buffers and command buffer too, so that uploads, dispatches and downloads can be repeated (and
timed) apart.

Host-visible, host-coherent memory throughout: simple and exact; fast enough on lavapipe, where
device memory is host memory anyway.
"""

from __future__ import annotations

import numbers
import os
import shutil
import struct
import subprocess
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# Compute pipelines a device keeps (per shader and specialization), least recently used first out.
MAX_PIPELINES = 64
_PipelineKey = tuple[bytes, int, int, tuple[tuple[int, int], ...]]


class VulkanUnavailableError(RuntimeError):
    """No Vulkan loader or no Vulkan device with a compute queue."""


@dataclass(frozen=True)
class DeviceInfo:
    """What a Vulkan physical device says of itself."""

    name: str
    api_version: str
    driver_version: int
    driver_name: str
    driver_info: str
    device_type: str


def _version_string(version: int) -> str:
    return f"{version >> 22}.{(version >> 12) & 0x3FF}.{version & 0xFFF}"


_DEVICE_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}


def _vk() -> Any:
    try:
        import vulkan
    except (ImportError, OSError) as error:  # OSError: the bindings found no libvulkan.so.1
        raise VulkanUnavailableError(
            f"the Vulkan loader could not be loaded ({error}); install libvulkan1 and "
            "mesa-vulkan-drivers (scripts/setup.sh does)"
        ) from error
    return vulkan


def find_glsl_compiler() -> list[str]:
    """The command that compiles a GLSL compute shader: Debian's ``glslangValidator`` or, without
    it, the ``glslc`` that the ai-ml-sdk-scenario-runner wheel ships. Raises ``FileNotFoundError``
    naming what to install."""
    validator = shutil.which("glslangValidator")
    if validator:
        return [validator, "-V", "--target-env", "vulkan1.2", "-S", "comp"]
    glslc = shutil.which("glslc")
    if glslc is None:
        try:
            import scenario_runner

            candidate = Path(scenario_runner.__path__[0]) / "binaries" / "bin" / "glslc"
            glslc = str(candidate) if candidate.is_file() else None
        except ImportError:
            glslc = None
    if glslc:
        return [glslc, "--stage", "compute"]
    raise FileNotFoundError(
        "no GLSL compiler: install Debian's glslang-tools (glslangValidator) or the "
        "ai-ml-sdk-scenario-runner wheel (glslc)"
    )


def compile_glsl(source: str, defines: dict[str, str | int] | None = None) -> bytes:
    """Compiles a GLSL compute shader to SPIR-V, with ``#define`` lines for ``defines`` placed
    after its ``#version`` line. Raises ``RuntimeError`` with the compiler's message when the
    source does not compile, ``TypeError`` for a source that is not a string."""
    if not isinstance(source, str):
        raise TypeError(f"source must be the GLSL text (a str), got {type(source).__name__}")
    lines = source.splitlines()
    version_line = next((i for i, line in enumerate(lines) if line.startswith("#version")), -1)
    lines[version_line + 1 : version_line + 1] = [
        f"#define {key} {value}" for key, value in (defines or {}).items()
    ]
    compiler = find_glsl_compiler()
    with tempfile.TemporaryDirectory(prefix="etkit-glsl-") as tmp:
        src, spv = Path(tmp) / "shader.comp", Path(tmp) / "shader.spv"
        src.write_text("\n".join(lines) + "\n")
        if Path(compiler[0]).name == "glslc":
            args = [*compiler, "--input", str(src), "--output", str(spv)]
        else:
            args = [*compiler, str(src), "-o", str(spv)]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not spv.is_file():
            raise RuntimeError(f"GLSL compilation failed:\n{done.stdout}{done.stderr}")
        return spv.read_bytes()


class ComputeDevice:
    """One Vulkan device and compute queue. ``run`` dispatches a SPIR-V compute shader whose
    bindings 0..k-1 (set 0) are the given storage buffers, in order."""

    def __init__(self) -> None:
        vk = _vk()
        self._vk = vk
        app_info = vk.VkApplicationInfo(
            sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
            pApplicationName="etkit",
            applicationVersion=1,
            pEngineName="etkit",
            engineVersion=1,
            apiVersion=vk.VK_MAKE_VERSION(1, 2, 0),
        )
        try:
            self._instance = vk.vkCreateInstance(
                vk.VkInstanceCreateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pApplicationInfo=app_info
                ),
                None,
            )
            physical_devices = vk.vkEnumeratePhysicalDevices(self._instance)
        except vk.VkError as error:
            raise VulkanUnavailableError(f"Vulkan instance creation failed: {error!r}") from error
        chosen = None
        for physical in physical_devices:
            families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical)
            for index, family in enumerate(families):
                if family.queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
                    chosen = (physical, index)
                    break
            if chosen:
                break
        if chosen is None:
            vk.vkDestroyInstance(self._instance, None)
            raise VulkanUnavailableError(
                "no Vulkan device with a compute queue; install mesa-vulkan-drivers (lavapipe)"
            )
        self._physical, self._queue_family = chosen
        supported = vk.vkGetPhysicalDeviceFeatures(self._physical)
        #: Whether the device offers 64-bit shader integers (shaderInt64). Informational: no
        #: optional feature is enabled, and the grid sampler's kernel uses 32-bit integers only.
        self.shader_int64 = bool(supported.shaderInt64)
        queue_info = vk.VkDeviceQueueCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
            queueFamilyIndex=self._queue_family,
            queueCount=1,
            pQueuePriorities=[1.0],
        )
        self._device = vk.vkCreateDevice(
            self._physical,
            vk.VkDeviceCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                queueCreateInfoCount=1,
                pQueueCreateInfos=[queue_info],
            ),
            None,
        )
        self._queue = vk.vkGetDeviceQueue(self._device, self._queue_family, 0)
        self._memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self._physical)
        self._pipelines: OrderedDict[_PipelineKey, _Pipeline] = OrderedDict()
        limits = vk.vkGetPhysicalDeviceProperties(self._physical).limits
        #: The largest storage buffer a shader may bind, in bytes (maxStorageBufferRange).
        self.max_storage_buffer_bytes = int(limits.maxStorageBufferRange)
        #: The most workgroups a dispatch may have along x, y, z (maxComputeWorkGroupCount).
        self.max_group_counts = tuple(int(limits.maxComputeWorkGroupCount[i]) for i in range(3))
        self._command_pool = vk.vkCreateCommandPool(
            self._device,
            vk.VkCommandPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                queueFamilyIndex=self._queue_family,
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            ),
            None,
        )

    def info(self) -> DeviceInfo:
        """Name, API version and driver of the device this runner uses."""
        vk = self._vk
        properties = vk.vkGetPhysicalDeviceProperties(self._physical)
        driver_name = driver_info = ""
        try:
            driver = vk.VkPhysicalDeviceDriverProperties(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES
            )
            properties2 = vk.VkPhysicalDeviceProperties2(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=driver
            )
            vk.vkGetPhysicalDeviceProperties2(self._physical, properties2)
            driver_name = vk.ffi.string(driver.driverName).decode()
            driver_info = vk.ffi.string(driver.driverInfo).decode()
        except (AttributeError, vk.VkError):  # pre-1.2 device: no driver properties
            pass
        return DeviceInfo(
            name=properties.deviceName,
            api_version=_version_string(properties.apiVersion),
            driver_version=properties.driverVersion,
            driver_name=driver_name,
            driver_info=driver_info,
            device_type=_DEVICE_TYPES.get(properties.deviceType, "unknown"),
        )

    def _memory_type(self, type_bits: int, flags: int) -> int:
        for index in range(self._memory_properties.memoryTypeCount):
            memory_type = self._memory_properties.memoryTypes[index]
            if type_bits & (1 << index) and (memory_type.propertyFlags & flags) == flags:
                return index
        raise VulkanUnavailableError("no host-visible, host-coherent Vulkan memory type")

    def run(
        self,
        spirv: bytes,
        buffers: Sequence[npt.NDArray[Any]],
        group_counts: tuple[int, int, int],
        push_constants: bytes = b"",
        read_back: Sequence[int] | None = None,
        specialization: Sequence[tuple[int, int]] = (),
    ) -> list[npt.NDArray[Any]]:
        """Dispatches ``spirv`` (entry point ``main``) with ``buffers[i]`` bound at set 0, binding
        i, and returns copies of the buffers listed in ``read_back`` (all by default) after the
        dispatch, each with its input's dtype and shape. ``specialization``: (constant id, 32-bit
        integer value) of the specialization constants to set. Raises ``ValueError`` before
        allocating anything when a buffer or a group count exceeds this device's limits. The
        pipeline is built once per shader and specialization, and kept (``prepare``)."""
        self.check_limits(buffers, group_counts)
        read_back = list(range(len(buffers))) if read_back is None else list(read_back)
        if any(not 0 <= index < len(buffers) for index in read_back):
            raise ValueError(
                f"read_back must list buffer indices below {len(buffers)}, got {read_back}"
            )
        with self.prepare(
            spirv,
            [int(array.nbytes) for array in buffers],
            group_counts,
            push_constants,
            specialization,
        ) as bound:
            for index, array in enumerate(buffers):
                bound.write(index, array)
            bound.dispatch()
            return [
                bound.read(index, buffers[index].dtype, buffers[index].size).reshape(
                    buffers[index].shape
                )
                for index in read_back
            ]

    def prepare(
        self,
        spirv: bytes,
        buffer_bytes: Sequence[int],
        group_counts: tuple[int, int, int],
        push_constants: bytes = b"",
        specialization: Sequence[tuple[int, int]] = (),
    ) -> BoundDispatch:
        """A dispatch of ``spirv`` (specialized as ``run`` says) made ready to run many times:
        storage buffers of ``buffer_bytes`` bytes (set 0, bindings 0..k-1; host-visible,
        mapped), its descriptor set and its recorded command buffer. ``write`` / ``dispatch`` /
        ``read`` on the result upload, run and download separately (a benchmark times them
        apart); ``close`` it, or use it as a context manager. Raises ``ValueError`` when a size
        or a group count exceeds this device's limits."""
        self._check_sizes(list(buffer_bytes), group_counts)
        return BoundDispatch(
            self, spirv, buffer_bytes, group_counts, push_constants, specialization
        )

    def check_limits(
        self, buffers: Sequence[npt.NDArray[Any]], group_counts: tuple[int, int, int]
    ) -> None:
        """Raises ``ValueError`` naming the buffer or the group count that this device cannot
        bind or dispatch (``TypeError`` for a buffer that is not a NumPy array)."""
        for index, array in enumerate(buffers):
            if not isinstance(array, np.ndarray):
                raise TypeError(
                    f"buffer {index} must be a numpy.ndarray, got {type(array).__name__}; convert "
                    "a tensor with .numpy()"
                )
        self._check_sizes([int(array.nbytes) for array in buffers], group_counts)

    def _check_sizes(self, buffer_bytes: list[int], group_counts: tuple[int, int, int]) -> None:
        for index, size in enumerate(buffer_bytes):
            if size > self.max_storage_buffer_bytes:
                raise ValueError(
                    f"buffer {index} has {size} bytes, more than this Vulkan device's "
                    f"maxStorageBufferRange of {self.max_storage_buffer_bytes} bytes; split the "
                    "work into smaller dispatches"
                )
        if len(group_counts) != 3 or not all(
            isinstance(count, numbers.Integral) and not isinstance(count, bool)
            for count in group_counts
        ):
            raise ValueError(f"group_counts must be 3 ints (x, y, z), got {group_counts!r}")
        for axis, count, limit in zip("xyz", group_counts, self.max_group_counts, strict=True):
            if not 0 <= count <= limit:
                raise ValueError(
                    f"group count {count} along {axis} is outside this Vulkan device's "
                    f"maxComputeWorkGroupCount of {limit}"
                )

    def _pipeline(
        self,
        spirv: bytes,
        binding_count: int,
        push_bytes: int,
        specialization: Sequence[tuple[int, int]] = (),
    ) -> _Pipeline:
        """The compute pipeline of ``spirv`` with ``binding_count`` storage buffers,
        ``push_bytes`` of push constants and these specialization constants (id, int32 value),
        built on first use and kept until ``close``: building it compiles the shader (on
        lavapipe, to machine code: tens of milliseconds)."""
        constants = tuple((int(constant_id), int(value)) for constant_id, value in specialization)
        key = (bytes(spirv), binding_count, push_bytes, constants)
        cached = self._pipelines.get(key)
        if cached is not None:
            self._pipelines.move_to_end(key)
            return cached
        vk = self._vk
        device = self._device
        bindings = [
            vk.VkDescriptorSetLayoutBinding(
                binding=i,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            )
            for i in range(binding_count)
        ]
        set_layout = vk.vkCreateDescriptorSetLayout(
            device,
            vk.VkDescriptorSetLayoutCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                bindingCount=len(bindings),
                pBindings=bindings,
            ),
            None,
        )
        push_ranges = (
            [
                vk.VkPushConstantRange(
                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push_bytes
                )
            ]
            if push_bytes
            else []
        )
        pipeline_layout = vk.vkCreatePipelineLayout(
            device,
            vk.VkPipelineLayoutCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                setLayoutCount=1,
                pSetLayouts=[set_layout],
                pushConstantRangeCount=len(push_ranges),
                pPushConstantRanges=push_ranges or None,
            ),
            None,
        )
        module = vk.vkCreateShaderModule(
            device,
            vk.VkShaderModuleCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                codeSize=len(spirv),
                pCode=spirv,
            ),
            None,
        )
        try:
            # The stage info (and its entry-point name) must outlive pipeline creation: an
            # inline temporary is freed early and creation fails with VkErrorUnknown.
            # as must the specialization data, which the stage info points into
            data = struct.pack(f"<{len(constants)}i", *(value for _, value in constants))
            data_buffer = vk.ffi.new("char[]", data) if constants else None
            entries = [
                vk.VkSpecializationMapEntry(constantID=constant_id, offset=4 * i, size=4)
                for i, (constant_id, _) in enumerate(constants)
            ]
            specialization_info = (
                vk.VkSpecializationInfo(
                    mapEntryCount=len(entries),
                    pMapEntries=entries,
                    dataSize=len(data),
                    pData=data_buffer,
                )
                if constants
                else None
            )
            stage = vk.VkPipelineShaderStageCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                module=module,
                pName="main",
                pSpecializationInfo=specialization_info,
            )
            pipeline_info = vk.VkComputePipelineCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                stage=stage,
                layout=pipeline_layout,
            )
            pipeline = vk.vkCreateComputePipelines(device, None, 1, [pipeline_info], None)[0]
        except BaseException:
            vk.vkDestroyShaderModule(device, module, None)
            vk.vkDestroyPipelineLayout(device, pipeline_layout, None)
            vk.vkDestroyDescriptorSetLayout(device, set_layout, None)
            raise
        created = _Pipeline(module, set_layout, pipeline_layout, pipeline)
        self._pipelines[key] = created
        # the least recently used ones beyond MAX_PIPELINES go (not those in use)
        unused = [old_key for old_key, old in self._pipelines.items() if old.users == 0]
        for old_key in unused[: max(0, len(self._pipelines) - MAX_PIPELINES)]:
            self._destroy_pipeline(self._pipelines.pop(old_key))
        return created

    def _destroy_pipeline(self, pipeline: _Pipeline) -> None:
        vk = self._vk
        vk.vkDestroyPipeline(self._device, pipeline.pipeline, None)
        vk.vkDestroyShaderModule(self._device, pipeline.module, None)
        vk.vkDestroyPipelineLayout(self._device, pipeline.layout, None)
        vk.vkDestroyDescriptorSetLayout(self._device, pipeline.set_layout, None)

    def _host_buffer(self, size: int) -> tuple[Any, Any, Any]:
        """A storage buffer of ``size`` bytes in host-visible, host-coherent memory, bound and
        mapped: (buffer, memory, mapping)."""
        vk = self._vk
        device = self._device
        buffer = vk.vkCreateBuffer(
            device,
            vk.VkBufferCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                size=size,
                usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE,
            ),
            None,
        )
        try:
            requirements = vk.vkGetBufferMemoryRequirements(device, buffer)
            memory = vk.vkAllocateMemory(
                device,
                vk.VkMemoryAllocateInfo(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                    allocationSize=requirements.size,
                    memoryTypeIndex=self._memory_type(
                        requirements.memoryTypeBits,
                        vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
                        | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                    ),
                ),
                None,
            )
        except BaseException:
            vk.vkDestroyBuffer(device, buffer, None)
            raise
        try:
            vk.vkBindBufferMemory(device, buffer, memory, 0)
            mapping = vk.vkMapMemory(device, memory, 0, size, 0)
        except BaseException:
            vk.vkDestroyBuffer(device, buffer, None)
            vk.vkFreeMemory(device, memory, None)
            raise
        return buffer, memory, mapping

    def close(self) -> None:
        """Releases the device; the runner cannot be used afterwards."""
        vk = self._vk
        if getattr(self, "_device", None) is not None:
            for pipeline in self._pipelines.values():
                self._destroy_pipeline(pipeline)
            self._pipelines.clear()
            vk.vkDestroyCommandPool(self._device, self._command_pool, None)
            vk.vkDestroyDevice(self._device, None)
            vk.vkDestroyInstance(self._instance, None)
            self._device = None


@dataclass
class _Pipeline:
    module: Any
    set_layout: Any
    layout: Any
    pipeline: Any
    users: int = 0  # the BoundDispatch objects open on it: it is not evicted while they are


class BoundDispatch:
    """One compute dispatch prepared to run many times (``ComputeDevice.prepare``): its storage
    buffers stay allocated and mapped, its command buffer recorded. ``write`` uploads a buffer,
    ``dispatch`` runs the shader and waits for it, ``read`` downloads a buffer."""

    def __init__(
        self,
        owner: ComputeDevice,
        spirv: bytes,
        buffer_bytes: Sequence[int],
        group_counts: tuple[int, int, int],
        push_constants: bytes,
        specialization: Sequence[tuple[int, int]] = (),
    ) -> None:
        vk = owner._vk
        self._vk = vk
        self._device = owner._device
        self._command_pool = owner._command_pool
        self._queue = owner._queue
        self.sizes = [max(int(size), 4) for size in buffer_bytes]
        self._buffers: list[tuple[Any, Any, Any]] = []
        self._pool: Any = None
        self._command_buffer: Any = None
        self._fence: Any = None
        self._pipeline: _Pipeline | None = None
        try:
            pipeline = owner._pipeline(spirv, len(self.sizes), len(push_constants), specialization)
            pipeline.users += 1
            self._pipeline = pipeline
            for size in self.sizes:
                self._buffers.append(owner._host_buffer(size))
            self._record(pipeline, group_counts, push_constants)
            self._fence = vk.vkCreateFence(
                self._device,
                vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO),
                None,
            )
        except BaseException:
            self.close()
            raise

    def _record(
        self, pipeline: _Pipeline, group_counts: tuple[int, int, int], push_constants: bytes
    ) -> None:
        vk = self._vk
        device = self._device
        self._pool = vk.vkCreateDescriptorPool(
            device,
            vk.VkDescriptorPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                maxSets=1,
                poolSizeCount=1,
                pPoolSizes=[
                    vk.VkDescriptorPoolSize(
                        type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                        descriptorCount=len(self._buffers),
                    )
                ],
            ),
            None,
        )
        descriptor_set = vk.vkAllocateDescriptorSets(
            device,
            vk.VkDescriptorSetAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                descriptorPool=self._pool,
                descriptorSetCount=1,
                pSetLayouts=[pipeline.set_layout],
            ),
        )[0]
        buffer_infos = [
            vk.VkDescriptorBufferInfo(buffer=buffer, offset=0, range=size)
            for (buffer, _, _), size in zip(self._buffers, self.sizes, strict=True)
        ]
        writes = [
            vk.VkWriteDescriptorSet(
                sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                dstSet=descriptor_set,
                dstBinding=i,
                descriptorCount=1,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                pBufferInfo=[info],
            )
            for i, info in enumerate(buffer_infos)
        ]
        vk.vkUpdateDescriptorSets(device, len(writes), writes, 0, None)
        self._command_buffer = vk.vkAllocateCommandBuffers(
            device,
            vk.VkCommandBufferAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                commandPool=self._command_pool,
                level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                commandBufferCount=1,
            ),
        )[0]
        command_buffer = self._command_buffer
        vk.vkBeginCommandBuffer(
            command_buffer,
            vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO),
        )
        vk.vkCmdBindPipeline(command_buffer, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline)
        vk.vkCmdBindDescriptorSets(
            command_buffer,
            vk.VK_PIPELINE_BIND_POINT_COMPUTE,
            pipeline.layout,
            0,
            1,
            [descriptor_set],
            0,
            None,
        )
        if push_constants:
            vk.vkCmdPushConstants(
                command_buffer,
                pipeline.layout,
                vk.VK_SHADER_STAGE_COMPUTE_BIT,
                0,
                len(push_constants),
                vk.ffi.from_buffer(push_constants),
            )
        vk.vkCmdDispatch(command_buffer, *group_counts)
        # the shader's writes made visible to the host's reads after the fence
        vk.vkCmdPipelineBarrier(
            command_buffer,
            vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
            vk.VK_PIPELINE_STAGE_HOST_BIT,
            0,
            1,
            [
                vk.VkMemoryBarrier(
                    sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                    srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                    dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT,
                )
            ],
            0,
            None,
            0,
            None,
        )
        vk.vkEndCommandBuffer(command_buffer)

    def write(self, index: int, array: npt.NDArray[Any]) -> None:
        """Copies ``array``'s bytes (memory order) to the start of buffer ``index``."""
        host = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if host.size > self.sizes[index]:
            raise ValueError(
                f"buffer {index} holds {self.sizes[index]} bytes, got an array of {host.size}"
            )
        np.frombuffer(self._buffers[index][2], dtype=np.uint8, count=host.size)[:] = host

    def read(self, index: int, dtype: npt.DTypeLike, count: int) -> npt.NDArray[Any]:
        """A copy of the first ``count`` elements of ``dtype`` in buffer ``index``."""
        return np.frombuffer(self._buffers[index][2], dtype=dtype, count=count).copy()

    def dispatch(self) -> None:
        """Runs the recorded dispatch and waits for it to finish."""
        vk = self._vk
        vk.vkResetFences(self._device, 1, [self._fence])
        vk.vkQueueSubmit(
            self._queue,
            1,
            [
                vk.VkSubmitInfo(
                    sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                    commandBufferCount=1,
                    pCommandBuffers=[self._command_buffer],
                )
            ],
            self._fence,
        )
        vk.vkWaitForFences(self._device, 1, [self._fence], vk.VK_TRUE, 2**63 - 1)

    def close(self) -> None:
        """Frees the buffers, the descriptor set and the command buffer (idempotent)."""
        vk = self._vk
        device = self._device
        if self._fence is not None:
            vk.vkDestroyFence(device, self._fence, None)
            self._fence = None
        if self._command_buffer is not None:
            vk.vkFreeCommandBuffers(device, self._command_pool, 1, [self._command_buffer])
            self._command_buffer = None
        if self._pool is not None:
            vk.vkDestroyDescriptorPool(device, self._pool, None)
            self._pool = None
        for buffer, memory, _ in self._buffers:
            vk.vkDestroyBuffer(device, buffer, None)
            vk.vkFreeMemory(device, memory, None)
        self._buffers = []
        if self._pipeline is not None:
            self._pipeline.users -= 1
            self._pipeline = None

    def __enter__(self) -> BoundDispatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@cache
def default_device() -> ComputeDevice:
    """The process-wide compute runner (created on first use). Raises
    ``VulkanUnavailableError`` when there is no usable Vulkan device."""
    if os.environ.get("ETKIT_DISABLE_VULKAN") == "1":
        raise VulkanUnavailableError("Vulkan is disabled by ETKIT_DISABLE_VULKAN=1")
    return ComputeDevice()
