// Records ggml's reference activation quantizers and CPU dot products for
// runtime/tests/kernels.rs (output: kernels_ggml.json in this folder).
//
//   LLAMA=/path/to/llama.cpp   # built, 0c1e570 (vendored in llama-cpp-python 0.3.36)
//   cc -O1 -o /tmp/kg kernels_ggml.c -I$LLAMA/ggml/include -L$LLAMA/build/bin \
//      -lggml-cpu -lggml-base -Wl,-rpath,$LLAMA/build/bin -lm
//   /tmp/kg > kernels_ggml.json
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"

void quantize_row_q8_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k);

static uint64_t state = 0x9e3779b97f4a7c15ull;
static uint32_t next(void) {
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return (uint32_t)(state >> 32);
}
// Uniform in [-scale, scale).
static float uni(float scale) { return ((float)(next() >> 8) / 8388608.0f - 1.0f) * scale; }

static void hex(const void *p, size_t n) {
    const uint8_t *b = p;
    putchar('"');
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    putchar('"');
}
static void floats(const float *x, int n) { hex(x, (size_t)n * 4); }

// Inputs: n = 512 values (two Q8_K super-blocks, 16 Q8_0 blocks), with ties.
static void input(int kind, float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = uni(kind == 0 ? 1.0f : kind == 1 ? 100.0f : 1e-3f);
    if (kind == 0) {
        // Block 1: amax 127 so d = 1: x.5 values round away from zero (roundf).
        for (int j = 0; j < 32; j++) x[32 + j] = (float)(j - 16) + 0.5f;
        x[32] = -127.0f;
        // Block 2: all zero (d = 0).
        for (int j = 0; j < 32; j++) x[64 + j] = 0.0f;
        // Super-block 1 (values 256..511): signed max -127 so iscale = 1: nearest_int ties to even.
        for (int j = 0; j < 256; j++) x[256 + j] = (float)((j % 200) - 100) + 0.5f;
        x[300] = -127.0f;
    }
    if (kind == 1) {
        // Super-block 0 all zero (d = 0 path of q8_K); positive signed max in super-block 1.
        for (int j = 0; j < 256; j++) x[j] = 0.0f;
        x[400] = 150.0f;
    }
}

int main(void) {
    enum { N = 512 };
    ggml_cpu_init();
    float x[N];
    uint8_t out[4096];
    printf("{\n\"note\": \"recorded by kernels_ggml.c from llama.cpp 0c1e570 (ggml reference quantizers, ggml-cpu vec_dot)\",\n");
    printf("\"quantize\": [\n");
    for (int kind = 0; kind < 3; kind++) {
        input(kind, x, N);
        printf("{\"x\": "); floats(x, N);
        quantize_row_q8_0_ref(x, out, N); printf(",\n \"q8_0\": "); hex(out, N / 32 * 34);
        quantize_row_q8_1_ref(x, out, N); printf(",\n \"q8_1\": "); hex(out, N / 32 * 36);
        quantize_row_q8_K_ref(x, out, N); printf(",\n \"q8_K\": "); hex(out, N / 256 * 292);
        printf("}%s\n", kind < 2 ? "," : "");
    }
    // Importance weights for the types ggml cannot encode without (a fixed pattern, so that
    // the random stream, and with it every earlier entry, stays as it was).
    float qw[N];
    for (int i = 0; i < N; i++) qw[i] = 0.25f + (float)(i % 13) / 13.0f;
    printf("],\n\"imatrix\": "); floats(qw, N);
    printf(",\n\"vec_dot\": [\n");
    const enum ggml_type types[] = {
        GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
        GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
        GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
        GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_MXFP4, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
        GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M,
        GGML_TYPE_NVFP4, GGML_TYPE_Q1_0, GGML_TYPE_Q2_0,
    };
    const int nt = sizeof types / sizeof types[0];
    static uint8_t w[N * 4], a[N * 4];
    float wf[N];
    for (int t = 0; t < nt; t++) {
        const enum ggml_type ty = types[t];
        for (int i = 0; i < N; i++) wf[i] = uni(1.0f);
        for (int i = 0; i < N; i++) x[i] = uni(2.0f);
        const int weighted = ggml_quantize_requires_imatrix(ty);
        size_t wsize = ggml_quantize_chunk(ty, wf, w, 0, 1, N, weighted ? qw : NULL);
        const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu(ty);
        const enum ggml_type vt = tr->vec_dot_type;
        // Activations through ggml's reference quantizers (the CPU's from_float may be SIMD).
        size_t asize;
        if (vt == GGML_TYPE_Q8_0) { quantize_row_q8_0_ref(x, a, N); asize = N / 32 * 34; }
        else if (vt == GGML_TYPE_Q8_1) { quantize_row_q8_1_ref(x, a, N); asize = N / 32 * 36; }
        else if (vt == GGML_TYPE_Q8_K) { quantize_row_q8_K_ref(x, a, N); asize = N / 256 * 292; }
        else if (vt == GGML_TYPE_F16) { ggml_fp32_to_fp16_row(x, (ggml_fp16_t *)a, N); asize = N * 2; }
        else if (vt == GGML_TYPE_BF16) { ggml_fp32_to_bf16_row_ref(x, (ggml_bf16_t *)a, N); asize = N * 2; }
        else { memcpy(a, x, N * 4); asize = N * 4; }
        float s = 0;
        tr->vec_dot(N, &s, 0, w, 0, a, 0, 1);
        printf("{\"type\": \"%s\", \"w\": ", ggml_type_name(ty)); hex(w, wsize);
        printf(",\n \"wf\": "); floats(wf, N);
        printf(",\n \"imatrix\": %s", weighted ? "true" : "false");
        printf(",\n \"x\": "); floats(x, N);
        printf(",\n \"act\": "); hex(a, asize);
        // The decoder's output (ggml's to_float) for the weights written.
        float deq[N];
        const struct ggml_type_traits *tt = ggml_get_type_traits(ty);
        if (tt->to_float) tt->to_float(w, deq, N); else memcpy(deq, w, sizeof deq);
        printf(",\n \"deq\": "); floats(deq, N);
        printf(",\n \"dot\": %.9g}%s\n", s, t < nt - 1 ? "," : "");
    }
    printf("]\n}\n");
    return 0;
}
