/* One streaming step of a causal Conv1d for a batch of slots, with the ELU before it, its
 * left-context state and the residual add after it fused in: the CPU kernel of Mimi's SEANet
 * encoder (asr/engine/mimi.py, paths "c-rows" and "c-dots"). Built and loaded by asr/engine/seanet_kernel.py.
 *
 * For each slot b (split over OpenMP threads):
 *   inp  = [state[b] | elu(x[b])]                 (cin, pad + L), ELU only when `elu` is set
 *   state[b] = last `pad` samples of inp          only when active[b]
 *   y[b] = conv(inp, w, stride, dilation) + bias (+ res[b])
 * Layouts are contiguous float32: x (B, cin, L), state (B, cin, pad), w (cout, cin, k),
 * res and y (B, cout, lout) with lout = (pad + L - (k - 1) * dil - 1) / stride + 1.
 *
 * Two ways to do the sum (same math, different speed by layer shape):
 *   rows: vectorised over output time. Each tap (c, j) is a shifted row of the input (strided
 *         convs first split the input into `stride` phases so that rows stay contiguous); two
 *         output channels x 64 samples of accumulators stay in registers. For long outputs.
 *   dots: one dot product over cin * k per output sample (im2col columns). For short outputs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ELU(v) = v for v > 0, expm1(v) otherwise, in plain arithmetic so that the loop vectorises.
 * Range reduction v = n ln2 + r with |r| <= ln2 / 2, expm1(v) = 2^n expm1(r) + (2^n - 1), and
 * expm1(r) by its Taylor series to r^8 (truncation error below 2e-9 relative). */
__attribute__((optimize("no-associative-math"))) /* keep 2^n p + (2^n - 1) and v + 0 exact */
static void elu_row(const float *restrict x, float *restrict out, int n) {
    for (int i = 0; i < n; i++) {
        float v = x[i];
        float u = __builtin_fmaxf(__builtin_fminf(v, 0.f), -87.f);
        int32_t ni = (int32_t)(u * 1.44269504f - 0.5f); /* round(u / ln2): u <= 0 and the cast truncates */
        float fn = (float)ni;
        float r = (u - fn * 0.693145752f) - fn * 1.42860677e-06f; /* ln2 in two parts */
        float p = r * (1.f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f
                  + r * (1.3888889e-3f + r * (1.9841270e-4f + r * 2.4801587e-5f)))))));
        union { int32_t i; float f; } two_n = {.i = (ni + 127) << 23};
        out[i] = __builtin_fmaxf(v, 0.f) + (two_n.f * p + (two_n.f - 1.f)); /* expm1(0) is exactly 0 */
    }
}

typedef float vf __attribute__((vector_size(64))); /* 16 floats: one AVX-512 or two AVX2 registers */
static inline vf ld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf splat(float s) { return (vf){} + s; }

/* y[o, t] = bias[o] + res[o, t] + sum_q w[o, q] * base[off[q] + t], t < lout. */
static void conv_rows(int cout, int K, int lout, const float *base, const int *off, const float *w,
                      const float *bias, const float *res, float *y) {
    for (int o = 0; o < cout; o += 2) {
        const int two = o + 1 < cout;
        const float *w0 = w + (size_t)o * K, *w1 = two ? w0 + K : w0;
        const float b0 = bias ? bias[o] : 0.f, b1 = bias && two ? bias[o + 1] : 0.f;
        float *y0 = y + (size_t)o * lout, *y1 = y0 + lout;
        const float *r0 = res ? res + (size_t)o * lout : NULL, *r1 = res ? r0 + lout : NULL;
        int t = 0;
        for (; t + 64 <= lout; t += 64) {
            vf a0 = splat(b0), a1 = a0, a2 = a0, a3 = a0, c0 = splat(b1), c1 = c0, c2 = c0, c3 = c0;
            for (int q = 0; q < K; q++) {
                const float *s = base + off[q] + t;
                vf s0 = ld(s), s1 = ld(s + 16), s2 = ld(s + 32), s3 = ld(s + 48);
                vf u = splat(w0[q]), v = splat(w1[q]);
                a0 += u * s0; a1 += u * s1; a2 += u * s2; a3 += u * s3;
                c0 += v * s0; c1 += v * s1; c2 += v * s2; c3 += v * s3;
            }
            if (res) {
                a0 += ld(r0 + t); a1 += ld(r0 + t + 16); a2 += ld(r0 + t + 32); a3 += ld(r0 + t + 48);
                if (two) { c0 += ld(r1 + t); c1 += ld(r1 + t + 16); c2 += ld(r1 + t + 32); c3 += ld(r1 + t + 48); }
            }
            st(y0 + t, a0); st(y0 + t + 16, a1); st(y0 + t + 32, a2); st(y0 + t + 48, a3);
            if (two) { st(y1 + t, c0); st(y1 + t + 16, c1); st(y1 + t + 32, c2); st(y1 + t + 48, c3); }
        }
        for (; t + 16 <= lout; t += 16) {
            vf a0 = splat(b0), c0 = splat(b1);
            for (int q = 0; q < K; q++) {
                vf s0 = ld(base + off[q] + t);
                a0 += splat(w0[q]) * s0; c0 += splat(w1[q]) * s0;
            }
            if (res) { a0 += ld(r0 + t); if (two) c0 += ld(r1 + t); }
            st(y0 + t, a0);
            if (two) st(y1 + t, c0);
        }
        for (; t < lout; t++) {
            float a = b0, c = b1;
            for (int q = 0; q < K; q++) { float s0 = base[off[q] + t]; a += w0[q] * s0; c += w1[q] * s0; }
            if (res) { a += r0[t]; if (two) c += r1[t]; }
            y0[t] = a;
            if (two) y1[t] = c;
        }
    }
}

/* The same sum as dot products: cols[t] holds the cin * k input samples output t reads. */
static void conv_dots(int cin, int cout, int k, int stride, int dil, int ltot, int lout, const float *inp,
                      float *cols, const float *w, const float *bias, const float *res, float *y) {
    const int K = cin * k;
    for (int t = 0; t < lout; t++)
        for (int c = 0; c < cin; c++) {
            const float *s = inp + (size_t)c * ltot + (size_t)t * stride;
            float *d = cols + (size_t)t * K + (size_t)c * k;
            for (int j = 0; j < k; j++) d[j] = s[j * dil];
        }
    for (int o = 0; o < cout; o += 4) {
        const int n = cout - o < 4 ? cout - o : 4;
        const float *w0 = w + (size_t)o * K;
        const float *w1 = n > 1 ? w0 + K : w0, *w2 = n > 2 ? w0 + 2 * K : w0, *w3 = n > 3 ? w0 + 3 * K : w0;
        for (int t = 0; t < lout; t++) {
            const float *cv = cols + (size_t)t * K;
            float a[4] = {0.f, 0.f, 0.f, 0.f};
            for (int q = 0; q < K; q++) {
                float v = cv[q];
                a[0] += w0[q] * v; a[1] += w1[q] * v; a[2] += w2[q] * v; a[3] += w3[q] * v;
            }
            for (int i = 0; i < n; i++) {
                float r = a[i] + (bias ? bias[o + i] : 0.f);
                if (res) r += res[(size_t)(o + i) * lout + t];
                y[(size_t)(o + i) * lout + t] = r;
            }
        }
    }
}

/* Returns 0, or -1 when scratch memory could not be allocated (y is then incomplete). */
int duplex_stream_conv(int B, int cin, int cout, int k, int stride, int dil, int L, int pad,
                       const float *x, float *state, const uint8_t *active, const float *w,
                       const float *bias, const float *res, float *y, int elu, int dots, int nthreads) {
    const int ltot = pad + L, span = (k - 1) * dil + 1;
    const int lout = (ltot - span) / stride + 1;
    const int nph = (ltot + stride - 1) / stride; /* samples per phase of a strided input */
    const int rows_phased = !dots && stride > 1;
    int failed = 0;
    int *off = malloc(sizeof(int) * (size_t)cin * k);
    if (!off) return -1;
    for (int c = 0; c < cin; c++)
        for (int j = 0; j < k; j++)
            off[c * k + j] = rows_phased ? (c * stride + (j * dil) % stride) * nph + (j * dil) / stride
                                         : c * ltot + j * dil;
    #pragma omp parallel num_threads(nthreads) reduction(|: failed)
    {
        float *inp = malloc(sizeof(float) * (size_t)cin * ltot);
        float *ph = rows_phased ? malloc(sizeof(float) * (size_t)cin * stride * nph) : NULL;
        float *cols = dots ? malloc(sizeof(float) * (size_t)lout * cin * k) : NULL;
        const int ok = inp && (!rows_phased || ph) && (!dots || cols);
        failed |= !ok;
        #pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            if (!ok) continue;
            for (int c = 0; c < cin; c++) {
                float *row = inp + (size_t)c * ltot;
                float *sb = state + ((size_t)b * cin + c) * pad;
                const float *xr = x + ((size_t)b * cin + c) * L;
                if (pad) memcpy(row, sb, sizeof(float) * pad);
                if (elu) elu_row(xr, row + pad, L);
                else memcpy(row + pad, xr, sizeof(float) * L);
                if (pad && active[b]) memcpy(sb, row + L, sizeof(float) * pad);
            }
            const float *rb = res ? res + (size_t)b * cout * lout : NULL;
            float *yb = y + (size_t)b * cout * lout;
            if (dots) {
                conv_dots(cin, cout, k, stride, dil, ltot, lout, inp, cols, w, bias, rb, yb);
            } else if (!rows_phased) {
                conv_rows(cout, cin * k, lout, inp, off, w, bias, rb, yb);
            } else {
                for (int c = 0; c < cin; c++)
                    for (int r = 0; r < stride; r++) {
                        float *d = ph + ((size_t)c * stride + r) * nph;
                        const float *s = inp + (size_t)c * ltot + r;
                        int u = 0;
                        for (; u * stride + r < ltot; u++) d[u] = s[(size_t)u * stride];
                        for (; u < nph; u++) d[u] = 0.f;
                    }
                conv_rows(cout, cin * k, lout, ph, off, w, bias, rb, yb);
            }
        }
        free(inp);
        free(ph);
        free(cols);
    }
    free(off);
    return failed ? -1 : 0;
}
