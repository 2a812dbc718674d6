"""Golden tests: the loop IR before and after each schedule primitive (reviewed by hand).

Each case builds a small program, applies one primitive and compares the printed loop IR with the
expected text; the numeric tests in test_primitives.py run the same primitives on random data.
"""

import textwrap

import polytile as pt
from polytile.target import CPUTarget

# the printed IR depends on the SIMD width: fixed here (AVX-512) so that it does not depend on the host
TARGET = CPUTarget(vector_bits=512)


def matmul(M=10, N=7, K=5):
    A = pt.placeholder((M, K), "float32", "A")
    B = pt.placeholder((K, N), "float32", "B")
    k = pt.reduce_axis(K, "k")
    C = pt.compute((M, N), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C")
    return pt.create_schedule(pt.Func([A, B], [C], name="mm")), A, B, C


def stencil(N=9):
    X = pt.placeholder((N,), "float32", "X")
    T = pt.compute((N,), lambda i: X[i] * 2.0, "T")
    Y = pt.compute((N - 2,), lambda i: T[i] + T[i + 1] + T[i + 2], "Y")
    return pt.create_schedule(pt.Func([X], [Y], name="st")), X, T, Y


def mirror(N=4, M=5):
    X = pt.placeholder((N, M), "float32", "X")
    T = pt.compute((N, M), lambda i, j: X[i, j] * 2.0, "T")
    Y = pt.compute((N, M), lambda i, j: T[i, j] + T[i, M - 1 - j], "Y")
    return pt.create_schedule(pt.Func([X], [Y], name="mirror")), X, T, Y


def check(sched, expected):
    got = str(pt.lower(sched, TARGET))
    assert got == textwrap.dedent(expected).strip("\n"), got


def test_default():
    s, A, B, C = matmul()
    pass
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for i in [0, 10):
            for j in [0, 7):
              C[((7 * i) + j)] = 0.0
              for k in [0, 5):
                C[((7 * i) + j)] = (C[((7 * i) + j)] + (A[((5 * i) + k)] * B[(j + (7 * k))]))
    """)

def test_split():
    s, A, B, C = matmul()
    s[C].split("i", 4)
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for io in [0, 3):
            for ii in [0, (min(3, ((-4 * io) + 9)) + 1)):
              for j in [0, 7):
                C[(((7 * ii) + (28 * io)) + j)] = 0.0
                for k in [0, 5):
                  C[(((7 * ii) + (28 * io)) + j)] = (C[(((7 * ii) + (28 * io)) + j)] + (A[(((5 * ii) + (20 * io)) + k)] * B[(j + (7 * k))]))
    """)  # noqa: E501 - golden IR

def test_tile():
    s, A, B, C = matmul()
    s[C].tile("i", "j", 4, 3)
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for io in [0, 3):
            for jo in [0, 3):
              for ii in [0, (min(3, ((-4 * io) + 9)) + 1)):
                for ji in [0, (min(2, ((-3 * jo) + 6)) + 1)):
                  C[((((7 * ii) + (28 * io)) + ji) + (3 * jo))] = 0.0
                  for k in [0, 5):
                    C[((((7 * ii) + (28 * io)) + ji) + (3 * jo))] = (C[((((7 * ii) + (28 * io)) + ji) + (3 * jo))] + (A[(((5 * ii) + (20 * io)) + k)] * B[((ji + (3 * jo)) + (7 * k))]))
    """)  # noqa: E501 - golden IR

def test_reorder():
    s, A, B, C = matmul()
    s[C].reorder("k", "i")
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for j in [0, 7):
            for i in [0, 10):
              C[((7 * i) + j)] = 0.0
          for k in [0, 5):
            for j in [0, 7):
              for i in [0, 10):
                C[((7 * i) + j)] = (C[((7 * i) + j)] + (A[((5 * i) + k)] * B[(j + (7 * k))]))
    """)

def test_fuse():
    s, A, B, C = matmul()
    s[C].fuse("i", "j")
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for ij in [0, 70):
            C[ij] = 0.0
            for k in [0, 5):
              C[ij] = (C[ij] + (A[((5 * (ij div 7)) + k)] * B[((ij mod 7) + (7 * k))]))
    """)

def test_separate_unroll():
    s, A, B, C = matmul()
    s[C].split("j", 4).separate("jo").unroll("ji")
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for i in [0, 10):
            C[(7 * i)] = 0.0
            for k in [0, 5):
              C[(7 * i)] = (C[(7 * i)] + (A[((5 * i) + k)] * B[(7 * k)]))
            C[((7 * i) + 1)] = 0.0
            for k in [0, 5):
              C[((7 * i) + 1)] = (C[((7 * i) + 1)] + (A[((5 * i) + k)] * B[((7 * k) + 1)]))
            C[((7 * i) + 2)] = 0.0
            for k in [0, 5):
              C[((7 * i) + 2)] = (C[((7 * i) + 2)] + (A[((5 * i) + k)] * B[((7 * k) + 2)]))
            C[((7 * i) + 3)] = 0.0
            for k in [0, 5):
              C[((7 * i) + 3)] = (C[((7 * i) + 3)] + (A[((5 * i) + k)] * B[((7 * k) + 3)]))
            C[((7 * i) + 4)] = 0.0
            for k in [0, 5):
              C[((7 * i) + 4)] = (C[((7 * i) + 4)] + (A[((5 * i) + k)] * B[((7 * k) + 4)]))
            C[((7 * i) + 5)] = 0.0
            for k in [0, 5):
              C[((7 * i) + 5)] = (C[((7 * i) + 5)] + (A[((5 * i) + k)] * B[((7 * k) + 5)]))
            C[((7 * i) + 6)] = 0.0
            for k in [0, 5):
              C[((7 * i) + 6)] = (C[((7 * i) + 6)] + (A[((5 * i) + k)] * B[((7 * k) + 6)]))
    """)

def test_vectorize():
    s, A, B, C = matmul(N=16)
    s[C].reorder("i", "k", "j").vectorize("j")
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 16], C: float32[10, 16]):
          for i in [0, 10):
            C[ramp((16 * i), 1, 16)] = 0.0
            for k in [0, 5):
              C[ramp((16 * i), 1, 16)] = (C[ramp((16 * i), 1, 16)] + (x16(A[((5 * i) + k)]) * B[ramp((16 * k), 1, 16)]))
    """)

def test_parallel():
    s, A, B, C = matmul()
    s[C].parallel("i")
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for parallel i in [0, 10):
            for j in [0, 7):
              C[((7 * i) + j)] = 0.0
              for k in [0, 5):
                C[((7 * i) + j)] = (C[((7 * i) + j)] + (A[((5 * i) + k)] * B[(j + (7 * k))]))
    """)

def test_apply_sch():
    s, A, B, C = matmul()
    s[C].apply_sch("{ [i, j, k] -> [j, i, k] }", ["jj", "ii", "kk"])
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for jj in [0, 7):
            for ii in [0, 10):
              C[((7 * ii) + jj)] = 0.0
              for kk in [0, 5):
                C[((7 * ii) + jj)] = (C[((7 * ii) + jj)] + (A[((5 * ii) + kk)] * B[(jj + (7 * kk))]))
    """)

def test_cache_identity():
    s, A, B, C = matmul()
    s[C].split("k", 2).cache_identity(B, "ko")
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for i in [0, 10):
            for j in [0, 7):
              C[((7 * i) + j)] = 0.0
              for ko in [0, 3):
                allocate B_C_local[2, 1] float32 in auto
                for B_C_local_q0 in [0, (min(1, ((-2 * ko) + 4)) + 1)):
                  B_C_local[B_C_local_q0] = B[(((7 * B_C_local_q0) + j) + (14 * ko))]
                for ki in [0, (min(1, ((-2 * ko) + 4)) + 1)):
                  C[((7 * i) + j)] = (C[((7 * i) + j)] + (A[(((5 * i) + ki) + (2 * ko))] * B_C_local[ki]))
    """)

def test_cache_layout():
    s, A, B, C = matmul(N=8)
    s[C].cache(B, None, layout=lambda kk, jj: (jj, kk))
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 8], C: float32[10, 8]):
          allocate B_C_local[8, 5] float32 in auto
          for B_C_local_q0 in [0, 8):
            for vectorize B_C_local_q1 in [0, 5):
              B_C_local[((5 * B_C_local_q0) + B_C_local_q1)] = B[(B_C_local_q0 + (8 * B_C_local_q1))]
          for i in [0, 10):
            for j in [0, 8):
              C[((8 * i) + j)] = 0.0
              for k in [0, 5):
                C[((8 * i) + j)] = (C[((8 * i) + j)] + (A[((5 * i) + k)] * B_C_local[((5 * j) + k)]))
    """)

def test_cache_write():
    s, A, B, C = matmul()
    s[C].split("j", 4).reorder("i", "jo", "k", "ji").cache_write("jo")
    check(s, """
        func mm(A: float32[10, 5], B: float32[5, 7], C: float32[10, 7]):
          for i in [0, 10):
            for jo in [0, 2):
              allocate C_local[1, 4] float32 in auto
              for ji in [0, (min(3, ((-4 * jo) + 6)) + 1)):
                C_local[ji] = 0.0
              for k in [0, 5):
                for ji in [0, (min(3, ((-4 * jo) + 6)) + 1)):
                  C_local[ji] = (C_local[ji] + (A[((5 * i) + k)] * B[((ji + (4 * jo)) + (7 * k))]))
              for vectorize C_local_q1 in [0, (min(3, ((-4 * jo) + 6)) + 1)):
                C[((C_local_q1 + (7 * i)) + (4 * jo))] = C_local[C_local_q1]
    """)

def test_fusion_after():
    s, X, T, Y = stencil()
    s[T].shift("i", -2)
    s[Y].after(s[T], "i")
    check(s, """
        func st(X: float32[9], Y: float32[7]):
          allocate T[9] float32 in auto
          for i in [-2, -2 + 9):
            T[(i + 2)] = (X[(i + 2)] * 2.0)
            if (i >= 0):
              Y[i] = ((T[i] + T[(i + 1)]) + T[(i + 2)])
    """)

def test_reverse():
    s, X, T, Y = stencil()
    s[T].reverse("i")
    check(s, """
        func st(X: float32[9], Y: float32[7]):
          allocate T[9] float32 in auto
          for i in [-8, -8 + 9):
            T[(-1 * i)] = (X[(-1 * i)] * 2.0)
          for i in [0, 7):
            Y[i] = ((T[i] + T[(i + 1)]) + T[(i + 2)])
    """)

def test_skew():
    s, A, B, C = matmul(M=4, N=3)
    s[C].skew("i", "j", 1)
    check(s, """
        func mm(A: float32[4, 5], B: float32[5, 3], C: float32[4, 3]):
          for i in [0, 4):
            for j in [i, i + 3):
              C[((2 * i) + j)] = 0.0
              for k in [0, 5):
                C[((2 * i) + j)] = (C[((2 * i) + j)] + (A[((5 * i) + k)] * B[(((-1 * i) + j) + (3 * k))]))
    """)

def test_before():
    s, X, T, Y = stencil()
    s[T].shift("i", -2).before(s[Y], "i")
    check(s, """
        func st(X: float32[9], Y: float32[7]):
          allocate T[9] float32 in auto
          for i in [-2, -2 + 9):
            T[(i + 2)] = (X[(i + 2)] * 2.0)
            if (i >= 0):
              Y[i] = ((T[i] + T[(i + 1)]) + T[(i + 2)])
    """)

def test_store_at():
    s, X, T, Y = mirror()
    s[Y].after(s[T], "i")
    s[T].store_at("i")
    check(s, """
        func mirror(X: float32[4, 5], Y: float32[4, 5]):
          for i in [0, 4):
            allocate T_stored[1, 5] float32 in auto
            for j in [0, 5):
              T_stored[j] = (X[((5 * i) + j)] * 2.0)
            for j in [0, 5):
              Y[((5 * i) + j)] = (T_stored[j] + T_stored[((-1 * j) + 4)])
    """)

def test_compute_inline():
    s, X, T, Y = stencil()
    s[T].compute_inline()
    check(s, """
        func st(X: float32[9], Y: float32[7]):
          for i in [0, 7):
            Y[i] = (((X[i] * 2.0) + (X[(i + 1)] * 2.0)) + (X[(i + 2)] * 2.0))
    """)

def test_store_layout():
    s, X, T, Y = stencil()
    s[T].store(lambda i: (8 - i,))
    check(s, """
        func st(X: float32[9], Y: float32[7]):
          allocate T_stored[9] float32 in auto
          for i in [0, 9):
            T_stored[((-1 * i) + 8)] = (X[i] * 2.0)
          for i in [0, 7):
            Y[i] = ((T_stored[((-1 * i) + 8)] + T_stored[((-1 * i) + 7)]) + T_stored[((-1 * i) + 6)])
    """)
