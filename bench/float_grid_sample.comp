#version 450
// The benchmark's float32 anchor (bench/vulkan_bench.py): a plain float32 bilinear grid sampler
// for RGBA channels-last images, PyTorch's grid_sample(mode="bilinear", padding_mode="border",
// align_corners=False) on float32 values. One invocation per output pixel, 64 a workgroup, as in
// etkit's integer kernel; the workgroup's z is the batch index. Its parameters are read once, at
// the start, as etkit's kernel reads its own (on lavapipe, a storage-buffer load inside a branch
// is made per invocation).

layout(local_size_x = 64) in;

layout(set = 0, binding = 0) readonly buffer Image { vec4 image[]; };  // N x H x W, RGBA
layout(set = 0, binding = 1) readonly buffer Grid { vec2 grid[]; };    // N x Ho x Wo, (x, y)
layout(set = 0, binding = 2) writeonly buffer Output { vec4 result[]; };
layout(set = 0, binding = 3) readonly buffer Params {
  int height, width, out_pixels, invocations_per_row;  // out_pixels: Ho * Wo
} p;

int height, width;

vec4 tap(int base, int x, int y) {
  if (uint(x) >= uint(width) || uint(y) >= uint(height)) {
    return vec4(0.0);
  }
  return image[base + y * width + x];
}

void main() {
  height = p.height;
  width = p.width;
  int out_pixels = p.out_pixels;
  uint index = gl_GlobalInvocationID.y * uint(p.invocations_per_row) + gl_GlobalInvocationID.x;
  if (index >= uint(out_pixels)) {
    return;
  }
  int n = int(gl_WorkGroupID.z);
  uint pixel = uint(n * out_pixels) + index;
  vec2 g = grid[pixel];
  vec2 size = vec2(width, height);
  // unnormalize (align_corners=False), then border: clip to [0, size - 1]
  vec2 coord = clamp(((g + 1.0) * size - 1.0) * 0.5, vec2(0.0), size - 1.0);
  vec2 corner = floor(coord);
  vec2 f = coord - corner;
  int x0 = int(corner.x), y0 = int(corner.y);
  int base = n * height * width;
  vec4 top = mix(tap(base, x0, y0), tap(base, x0 + 1, y0), f.x);
  vec4 bottom = mix(tap(base, x0, y0 + 1), tap(base, x0 + 1, y0 + 1), f.x);
  result[pixel] = mix(top, bottom, f.y);
}
