"""Burn-in measurement run ON the node under test (copied there by the gate).

Prints one JSON line: per GPU, bf16 matmul TFLOP/s and device memory bandwidth GB/s.
Needs PyTorch with CUDA on the node; exits 3 when it is missing.
"""

import json
import sys
import time


def main() -> int:
    try:
        import torch  # noqa: PLC0415 - only on the node, only for this
    except ImportError:
        print(json.dumps({"error": "PyTorch is not installed on the node"}))
        return 3
    if not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available to PyTorch"}))
        return 3
    n, iters = 8192, 50
    out = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        for _ in range(5):  # warm up clocks and cuBLAS heuristics
            a @ b
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        torch.cuda.synchronize(dev)
        tflops = 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12
        buf = torch.empty(2 * 1024**3 // 4, device=dev, dtype=torch.float32)  # 2 GiB
        dst = torch.empty_like(buf)
        dst.copy_(buf)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(20):
            dst.copy_(buf)
        torch.cuda.synchronize(dev)
        # A copy reads and writes every byte once.
        gbps = 2 * buf.numel() * 4 * 20 / (time.perf_counter() - t0) / 1e9
        out.append({"gpu": i, "bf16_tflops": round(tflops, 1), "mem_bw_gbps": round(gbps, 1)})
        del a, b, buf, dst
        torch.cuda.empty_cache()
    print(json.dumps({"gpus": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
