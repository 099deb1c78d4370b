// Timing harness for bench/gguf.sh: llama.cpp's own GGUF reader (gguf_init_from_file
// with no_alloc, i.e. header only, like memwall's mmap open). Prints the median in ms.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "gguf.h"

static int cmp(const void * a, const void * b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

int main(int argc, char ** argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s FILE [RUNS]\n", argv[0]); return 2; }
    int runs = argc > 2 ? atoi(argv[2]) : 20;
    double * t = calloc(runs, sizeof(double));
    for (int i = 0; i < runs; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        struct gguf_init_params p = { /*no_alloc =*/ true, /*ctx =*/ NULL };
        struct gguf_context * ctx = gguf_init_from_file(argv[1], p);
        if (!ctx) { fprintf(stderr, "failed to read %s\n", argv[1]); return 1; }
        gguf_free(ctx);
        clock_gettime(CLOCK_MONOTONIC, &b);
        t[i] = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
    }
    qsort(t, runs, sizeof(double), cmp);
    printf("%.3f\n", t[runs / 2]);
    return 0;
}
