// The GPU check's probe (tests/gpu/run_gpu_checks.sh --only probe): what the CUDA runtime sees,
// as towerflow will see it (CUDA_VISIBLE_DEVICES and MIG instances honoured, unlike
// `nvidia-smi -L`). Built with nvcc alone, before towerflow is; prints key=value lines:
//   driver=13000 runtime=13000 gpus=1 gpu0=NVIDIA H200|9.0|143771 MiB   (no_gpu=<why> when none)
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  int driver = 0, runtime = 0, count = 0;
  cudaDriverGetVersion(&driver);  // 0 where no driver is installed
  cudaRuntimeGetVersion(&runtime);
  std::printf("driver=%d\nruntime=%d\n", driver, runtime);
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    const char* why = driver == 0           ? "no NVIDIA driver is loaded (cudaDriverGetVersion gives 0)"
                      : e != cudaSuccess    ? cudaGetErrorString(e)
                                            : "the driver lists no device (CUDA_VISIBLE_DEVICES?)";
    std::printf("gpus=0\nno_gpu=%s\n", why);
    return 0;
  }
  std::printf("gpus=%d\n", count);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    std::printf("gpu%d=%s|%d.%d|%zu MiB\n", i, p.name, p.major, p.minor, p.totalGlobalMem >> 20);
  }
  return 0;
}
