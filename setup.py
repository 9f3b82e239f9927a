"""The compiled codec kernels (src/heterorl/weights/native/pulse.c): built by `pip install -e .` with the machine's C
compiler and Python's headers (no other build dependency); everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

NATIVE = "src/heterorl/weights/native"

setup(
    ext_modules=[
        Extension(
            "heterorl.weights.native._pulse",
            sources=[f"{NATIVE}/pulse.c"],
            depends=[f"{NATIVE}/xxhash.h", f"{NATIVE}/xxh_x86dispatch.c", f"{NATIVE}/xxh_x86dispatch.h"],
            include_dirs=[NATIVE],
            extra_compile_args=["-O3", "-falign-loops=64", "-fvisibility=hidden", "-Wno-unused-function"],
        )
    ]
)
