"""A real CUDA process for the monitor check: it takes ``--mib`` of the card's memory with a
plain device allocation, runs a small kernel over it again and again (so NVML has
utilization samples of it), says so on one JSON line on stdout, and runs until killed.

    python -m tests.gpu.cuda_worker --backend cupy|torch|driver --mib 512 [--device 0]

Three ways to the same end, tried one per process by the check, in that order, because a
machine may lack any one: CuPy (its kernel compiled by NVRTC), PyTorch (its kernels
prebuilt), and the CUDA driver API through cuda-python with a kernel written here in PTX,
which the driver itself compiles: nothing but the driver is needed. A backend that cannot
start prints ``{"ready": false, "error": ...}`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

PAUSE_S = 0.02
"""Between two kernel rounds: the card stays busy part of the time, the worker's CPU idle."""

# One byte per thread: data[i] += 1 for i < n. Written for the oldest target the driver
# accepts and compiled by it at load (cuModuleLoadData), for whatever card this is.
BUMP_PTX = b"""
.version 7.0
.target sm_50
.address_size 64

.visible .entry bump(
    .param .u64 bump_data,
    .param .u32 bump_n
)
{
    .reg .pred %p<2>;
    .reg .b16 %rs<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [bump_data];
    ld.param.u32 %r2, [bump_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    cvt.u64.u32 %rd3, %r1;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u8 %rs1, [%rd4];
    add.s16 %rs2, %rs1, 1;
    st.global.u8 [%rd4], %rs2;
DONE:
    ret;
}
\x00"""
KERNEL_BYTES = 64 * 1024 * 1024
"""How much of the allocation each kernel round touches."""


def _cupy(device: int, size: int) -> Callable[[], None]:
    import cupy  # noqa: PLC0415

    cupy.cuda.Device(device).use()
    data = cupy.zeros(size, dtype=cupy.uint8)
    window = data[:KERNEL_BYTES]

    def step() -> None:
        cupy.add(window, 1, out=window)  # an elementwise kernel, compiled by NVRTC once
        cupy.cuda.Device(device).synchronize()

    step()
    return step


def _torch(device: int, size: int) -> Callable[[], None]:
    import torch  # noqa: PLC0415

    data = torch.zeros(size, dtype=torch.uint8, device=f"cuda:{device}")
    window = data[:KERNEL_BYTES]

    def step() -> None:
        window.add_(1)
        torch.cuda.synchronize(device)

    step()
    return step


def _driver(device: int, size: int) -> Callable[[], None]:
    try:
        from cuda.bindings import driver  # noqa: PLC0415
    except ImportError:  # cuda-python before 12.6
        from cuda import cuda as driver  # noqa: PLC0415
    import numpy  # noqa: PLC0415

    def check(result: tuple[object, ...]) -> tuple[object, ...]:
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver call failed: {result[0]}")
        return result[1:]

    check(driver.cuInit(0))
    (handle,) = check(driver.cuDeviceGet(device))
    (context,) = check(driver.cuDevicePrimaryCtxRetain(handle))
    check(driver.cuCtxSetCurrent(context))
    (pointer,) = check(driver.cuMemAlloc(size))
    check(driver.cuMemsetD8(pointer, 0, size))
    ptx = numpy.frombuffer(BUMP_PTX, dtype=numpy.uint8).copy()
    (module,) = check(driver.cuModuleLoadData(ptx.ctypes.data))
    (function,) = check(driver.cuModuleGetFunction(module, b"bump"))
    (stream,) = check(driver.cuStreamCreate(0))
    # cuLaunchKernel takes an array of pointers to each argument's value.
    data = numpy.array([int(pointer)], dtype=numpy.uint64)
    count = numpy.array([KERNEL_BYTES], dtype=numpy.uint32)
    arguments = numpy.array([data.ctypes.data, count.ctypes.data], dtype=numpy.uint64)
    threads = 256

    def step() -> None:
        check(driver.cuLaunchKernel(function, KERNEL_BYTES // threads, 1, 1, threads, 1, 1,
                                    0, stream, arguments.ctypes.data, 0))
        check(driver.cuStreamSynchronize(stream))

    step()
    return step


BACKENDS: dict[str, Callable[[int, int], Callable[[], None]]] = {
    "cupy": _cupy, "torch": _torch, "driver": _driver}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(BACKENDS), required=True)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    size = args.mib * 1024 * 1024
    try:
        step = BACKENDS[args.backend](args.device, size)
    except Exception as error:  # any backend's failure is reported, the next one tried
        print(json.dumps({"ready": False, "backend": args.backend,
                          "error": f"{type(error).__name__}: {error}"[:2000]}), flush=True)
        return 1
    print(json.dumps({"ready": True, "backend": args.backend, "pid": os.getpid(),
                      "bytes": size, "device": args.device}), flush=True)
    while True:
        step()
        time.sleep(PAUSE_S)


if __name__ == "__main__":
    sys.exit(main())
