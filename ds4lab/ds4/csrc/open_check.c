/*
 * ds4lab's probe of a model file through ds4's public API (ds4.h) only.
 *
 * Build against ds4's CPU objects (ds4.c compiled with -DDS4_NO_GPU, ds4_distributed.c, ds4_tp.c,
 * ds4_ssd.c, ds4_layer_pack.c; scripts/ds4_open_check.sh does it in a scratch folder):
 *
 *   open_check MODEL inspect          open with inspect_only: ds4's metadata and tensor checks
 *   open_check MODEL cpu [N [CTX]]    open on ds4's CPU backend (adds the tokenizer), then, when
 *                                     N > 0, evaluate N tokens in one session of CTX positions
 *
 * ds4 exits the process on the first check a file fails, with its own message on stderr; this
 * program prints "open_check: OK ..." lines on stdout when a step passes, so a caller reads the
 * last line to know how far it got. Tokens evaluated: 0 (begin of sentence) then, for each next
 * token, the argmax of the previous one (greedy decode), each printed with its top logits and a
 * count of non-finite logits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds4.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void print_engine(ds4_engine *e) {
    ds4_engine_summary(e);
    printf("open_check: layers=%d routed_quant_bits=%d vocab=%d embd=%d model_bytes=%llu output_head=%d\n",
           ds4_engine_layer_count(e), ds4_engine_routed_quant_bits(e), ds4_engine_vocab_size(e),
           ds4_engine_embd_dim(e), (unsigned long long)ds4_engine_model_bytes(e),
           ds4_engine_has_output_head(e) ? 1 : 0);
    printf("open_check: compress_ratios=");
    for (int il = 0; il < ds4_engine_layer_count(e); il++) {
        printf("%s%u", il ? "," : "", ds4_engine_layer_compress_ratio(e, (uint32_t)il));
    }
    printf("\n");
}

static int eval_tokens(ds4_engine *e, int n_tokens, int ctx) {
    ds4_session *s = NULL;
    if (ds4_session_create(&s, e, ctx) != 0 || !s) {
        fprintf(stderr, "open_check: ds4_session_create(ctx=%d) failed\n", ctx);
        return 1;
    }
    const int vocab = ds4_engine_vocab_size(e);
    float *logits = malloc((size_t)vocab * sizeof(float));
    if (!logits) return 1;
    int token = 0;
    char err[512];
    for (int i = 0; i < n_tokens; i++) {
        err[0] = '\0';
        const double t0 = now_s();
        if (ds4_session_eval(s, token, err, sizeof(err)) != 0) {
            fprintf(stderr, "open_check: ds4_session_eval(token=%d) failed: %s\n", token, err);
            free(logits);
            ds4_session_free(s);
            return 1;
        }
        const double dt = now_s() - t0;
        const int n = ds4_session_copy_logits(s, logits, vocab);
        int nonfinite = 0;
        double lo = INFINITY, hi = -INFINITY, sum2 = 0.0;
        for (int j = 0; j < n; j++) {
            if (!isfinite(logits[j])) { nonfinite++; continue; }
            if (logits[j] < lo) lo = logits[j];
            if (logits[j] > hi) hi = logits[j];
            sum2 += (double)logits[j] * logits[j];
        }
        ds4_token_score top[3];
        const int ntop = ds4_session_top_logprobs(s, top, 3);
        const int next = ds4_session_argmax(s);
        printf("open_check: eval pos=%d token=%d argmax=%d logits=%d nonfinite=%d min=%.4g max=%.4g rms=%.4g "
               "seconds=%.2f top=", i, token, next, n, nonfinite, lo, hi, n ? sqrt(sum2 / n) : 0.0, dt);
        for (int j = 0; j < ntop; j++) printf("%s%d:%.4g", j ? "," : "", top[j].id, top[j].logit);
        printf("\n");
        fflush(stdout);
        token = next;
    }
    free(logits);
    ds4_session_free(s);
    printf("open_check: OK eval tokens=%d\n", n_tokens);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "inspect") && strcmp(argv[2], "cpu"))) {
        fprintf(stderr, "usage: %s MODEL inspect | MODEL cpu [N_TOKENS [CTX]]\n", argv[0]);
        return 2;
    }
    const bool inspect = !strcmp(argv[2], "inspect");
    const int n_tokens = argc > 3 ? atoi(argv[3]) : 0;
    const int ctx = argc > 4 ? atoi(argv[4]) : 64;
    ds4_engine_options opt;
    memset(&opt, 0, sizeof(opt));
    opt.model_path = argv[1];
    opt.backend = DS4_BACKEND_CPU;
    opt.inspect_only = inspect;
    opt.context_size = ctx;
    const char *threads = getenv("OPEN_CHECK_THREADS");
    opt.n_threads = threads ? atoi(threads) : 0;
    ds4_engine *e = NULL;
    const double t0 = now_s();
    if (ds4_engine_open(&e, &opt) != 0 || !e) {
        fprintf(stderr, "open_check: ds4_engine_open failed\n");
        return 1;
    }
    printf("open_check: OK open mode=%s seconds=%.2f\n", argv[2], now_s() - t0);
    print_engine(e);
    int rc = 0;
    if (!inspect && n_tokens > 0) rc = eval_tokens(e, n_tokens, ctx);
    ds4_engine_close(e);
    return rc;
}
