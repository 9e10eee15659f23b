"""Probe CuPy's launch and graph APIs on the device (one-off, results go to NOTES.md)."""
import inspect
import cupy
import numpy as np

k = cupy.RawKernel(r'extern "C" __global__ void f(float* x){ x[threadIdx.x] += 1.0f; }', "f")
x = cupy.zeros(32, dtype=np.float32)
fn = k.kernel
print("RawKernel.kernel:", type(fn), callable(fn))
try:
    print("Function.__call__ doc:", fn.__call__.__doc__)
except Exception as e:
    print(e)
s = cupy.cuda.Stream(non_blocking=True)
fn((1,), (32,), (x,), 0, s)
s.synchronize()
print("after Function call on stream:", float(x[0]))
fn((1,), (32,), (x,), 0, cupy.cuda.Stream.null)
cupy.cuda.runtime.deviceSynchronize()
print("after Function call on null:", float(x[0]))
print("Graph attrs:", [a for a in dir(cupy.cuda.graph.Graph) if not a.startswith("_")])
print("Stream attrs:", [a for a in dir(s) if not a.startswith("_")])
print("runtime capture fns:", [a for a in dir(cupy.cuda.runtime) if "apture" in a or "raph" in a])
