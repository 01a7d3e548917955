"""etkit's grid sampler inside a VGF: each sampler the integer contract covers becomes a COMPUTE
segment of the VGF carrying etkit's own shader (a TOSA ``CUSTOM`` op in the
``com.arm.VulkanCustomShader`` domain), so the stock ExecuTorch VGF runtime runs the whole model
on the GPU and nothing of etkit is needed on the device.

- ``payload``: the payload (bindings, formats, dispatch, the parameter block as a constant
  tensor or baked into a per-call-site shader) and ``validate``, its check against the SPIR-V;
- ``spirv``: what a SPIR-V compute shader declares (bindings, descriptor types, block sizes);
- ``lowering``: ``VgfSamplerPartitioner`` (which samplers stay in the VGF) and
  ``sampler_lowering`` (the rewrite pass, run before the Arm backend's own grid-sampler passes)
  and ``schedule_segments`` (the wave order model-converter cuts segments from);
- ``_arm``: the Arm-backend interfaces this needs, some private, with the version check.

Importing this package does not import the Arm backend; ``sampler_lowering`` does.
"""

from etkit_gridsampler.vgf_shader.lowering import (
    IN_VGF,
    OWN_DELEGATE,
    SamplerPath,
    VgfSamplerPartitioner,
    sampler_lowering,
    schedule_segments,
    vgf_reason,
)
from etkit_gridsampler.vgf_shader.payload import (
    DEFAULT_PARAMS_MODE,
    DOMAIN,
    OPERATOR_NAME,
    PARAMS_MODES,
    PayloadError,
    SamplerSegment,
    TensorSpec,
    build_segment,
    byte_size_reason,
    padded_channels,
    validate,
)
from etkit_gridsampler.vgf_shader.spirv import ShaderInterface, SpirvError, reflect

__all__ = [
    "DEFAULT_PARAMS_MODE",
    "DOMAIN",
    "IN_VGF",
    "OPERATOR_NAME",
    "OWN_DELEGATE",
    "PARAMS_MODES",
    "PayloadError",
    "SamplerPath",
    "SamplerSegment",
    "ShaderInterface",
    "SpirvError",
    "TensorSpec",
    "VgfSamplerPartitioner",
    "build_segment",
    "byte_size_reason",
    "padded_channels",
    "reflect",
    "sampler_lowering",
    "schedule_segments",
    "validate",
    "vgf_reason",
]
