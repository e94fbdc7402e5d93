"""The golden model of the vector unit (docs/vpu.md): its primitives in NumPy
float32 and uint32 arithmetic, and its functions as the sequences of
`mxu.hdl.vecmath`, run on whole arrays of bit patterns.

>>> vpu_exp(np.array([0x3F800000], np.uint32))      # bits of float32 e**1
"""

import numpy as np

from mxu.hdl import vecmath

from .golden import canonical, f32_bits

__all__ = ["NumpyOps", "fadd", "fmul", "fmax", "fmin", "vpu_exp", "vpu_reciprocal", "vpu_rsqrt",
           "vpu_function"]

_U32 = np.uint32


def _bits(a):
    a = np.asarray(a)
    if a.dtype != _U32:
        raise TypeError(f"operands must hold fp32 bit patterns as uint32, not {a.dtype}")
    return a


def _f(a):
    return _bits(a).view(np.float32)


def fadd(a, b):
    with np.errstate(all="ignore"):
        return f32_bits(_f(a) + _f(b))


def fmul(a, b):
    with np.errstate(all="ignore"):
        return f32_bits(_f(a) * _f(b))


def _order_key(a):
    """uint32 keys that order binary32 words like their values, with -0 < +0."""
    a = _bits(a)
    return np.where(a & 0x80000000, ~a, a | 0x80000000).astype(_U32)


def _is_nan(a):
    return (a & 0x7FFFFFFF) > 0x7F800000


def fmax(a, b):
    a, b = np.broadcast_arrays(_bits(a), _bits(b))
    out = np.where(_order_key(a) >= _order_key(b), a, b)
    return canonical(np.where(_is_nan(a) | _is_nan(b), _U32(vecmath.QNAN), out).astype(_U32))


def fmin(a, b):
    a, b = np.broadcast_arrays(_bits(a), _bits(b))
    out = np.where(_order_key(a) <= _order_key(b), a, b)
    return canonical(np.where(_is_nan(a) | _is_nan(b), _U32(vecmath.QNAN), out).astype(_U32))


class NumpyOps:
    """The `mxu.hdl.vecmath` operation interface on uint32 arrays."""

    @staticmethod
    def const(bits):
        return _U32(bits & 0xFFFFFFFF)

    fadd, fmul, fmax, fmin = staticmethod(fadd), staticmethod(fmul), staticmethod(fmax), \
        staticmethod(fmin)

    @staticmethod
    def iadd(a, b):
        return (np.asarray(a, _U32) + np.asarray(b, _U32)).astype(_U32)

    @staticmethod
    def isub(a, b):
        return (np.asarray(a, _U32) - np.asarray(b, _U32)).astype(_U32)

    @staticmethod
    def band(a, b):
        return np.asarray(a, _U32) & np.asarray(b, _U32)

    @staticmethod
    def bor(a, b):
        return np.asarray(a, _U32) | np.asarray(b, _U32)

    @staticmethod
    def shl(a, k):
        return (np.asarray(a, _U32) << _U32(k)).astype(_U32)

    @staticmethod
    def shr(a, k):
        return (np.asarray(a, _U32) >> _U32(k)).astype(_U32)

    @staticmethod
    def sar(a, k):
        return (np.asarray(a, _U32).view(np.int32) >> k).view(_U32)

    @staticmethod
    def shlv(a, b):
        b = np.asarray(b, _U32)
        if np.any(b > 31):
            raise ValueError("shlv: shift beyond 31")
        return (np.asarray(a, _U32) << b).astype(_U32)

    @staticmethod
    def clz(a):
        a = np.asarray(a, _U32)
        # float64 represents every uint32 exactly; frexp's exponent is bit_length.
        _, e = np.frexp(a.astype(np.float64))
        return (32 - np.where(a == 0, 0, e)).astype(_U32)

    @staticmethod
    def ieq(a, b):
        return (np.asarray(a, _U32) == np.asarray(b, _U32)).astype(_U32)

    @staticmethod
    def select(c, a, b):
        return np.where(np.asarray(c, _U32) != 0, a, b).astype(_U32)


def vpu_function(name, x):
    """`mxu.hdl.vecmath` function `name` ("exp", "reciprocal", "rsqrt") on uint32
    bit patterns `x`; returns uint32 bit patterns of the same shape."""
    x = _bits(x)
    out = vecmath.FUNCTIONS[name](NumpyOps, x)
    return np.broadcast_to(out, x.shape).astype(_U32)


def vpu_exp(x):
    return vpu_function("exp", x)


def vpu_reciprocal(x):
    return vpu_function("reciprocal", x)


def vpu_rsqrt(x):
    return vpu_function("rsqrt", x)
