"""Build only LMCache 0.5.6's CUDA extension ``lmcache.cuda_ops`` against the torch here.

Mirrors setup_extensions/build_profiles/cuda.py of the 0.5.6 sdist: the same 13 sources,
include dir csrc/, -D_GLIBCXX_USE_CXX11_ABI=1 for cxx and nvcc, BuildExtension (ninja).
No --threads: with MAX_JOBS=16 LMCache's own sizing gives NVCC_THREADS=1 on this host.
Run from an empty directory (so setuptools reads no pyproject.toml/setup.cfg):
  LMC_SRC=/path/lmcache-0.5.6 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 \
    python3 build_cuda_ops.py build_ext --build-lib OUT/lib --build-temp OUT/tmp
"""
import os

from setuptools import setup
from torch.utils import cpp_extension

SRC = os.environ["LMC_SRC"]
SOURCES = [
    "csrc/cuda/pybind.cpp",
    "csrc/cuda/mem_kernels.cu",
    "csrc/cuda/mp_mem_kernels.cu",
    "csrc/cuda/phase_timing_recorder.cu",
    "csrc/cuda/blend_kernels.cu",
    "csrc/cuda/cal_cdf.cu",
    "csrc/cuda/ac_enc.cu",
    "csrc/cuda/ac_dec.cu",
    "csrc/cuda/pos_kernels.cu",
    "csrc/cuda/mem_alloc.cpp",
    "csrc/cuda/utils.cpp",
    "csrc/cuda/event_recorder.cpp",
    "csrc/cuda/completion_recorder.cpp",
]
ABI = "-D_GLIBCXX_USE_CXX11_ABI=1"

setup(
    name="lmcache-cuda-ops-only",
    version="0.5.6",
    ext_modules=[
        cpp_extension.CUDAExtension(
            "lmcache.cuda_ops",
            sources=[os.path.join(SRC, s) for s in SOURCES],
            include_dirs=[os.path.join(SRC, "csrc")],
            extra_compile_args={"cxx": [ABI], "nvcc": [ABI]},
        )
    ],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
