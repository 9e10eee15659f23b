/* ds4lab's driver of ds4's public C API (ds4.h), built into one shared library with ds4's own
 * objects (ds4lab.ds4.build) and loaded by ds4lab.ds4.engine through ctypes.
 *
 * It exists for two things ds4.h does not give from Python: a ds4_engine_options filled the way
 * ds4-bench fills it (ds4_bench.c, main), and CUDA events around each decode token on the legacy
 * stream, where ds4 launches its eager kernels (ds4_cuda.cu, cuda_decode_stream). Nothing here
 * changes what ds4 runs: every token is one ds4_session_eval.
 *
 * Every CUDA status is checked; a failure is returned as a negative code with the message in the
 * handle's error buffer (ds4lab_error).
 *
 * Built with -DDS4LAB_CPU_ONLY (tests only: ds4's CPU back end, no CUDA), the engine opens on ds4's
 * CPU back end and "gpu_ms" is the host clock: it exists so that this driver and ds4lab's worker are
 * held to ds4's own code on a machine without a GPU, never to report a time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef DS4LAB_CPU_ONLY
#include <cuda_runtime.h>
#else
typedef int cudaEvent_t;
typedef int cudaError_t;
#define cudaSuccess 0
static cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = 0; return 0; }
static cudaError_t cudaEventDestroy(cudaEvent_t e) { (void)e; return 0; }
static cudaError_t cudaDeviceSynchronize(void) { return 0; }
static const char *cudaGetErrorName(cudaError_t e) { (void)e; return "cudaSuccess"; }
static const char *cudaGetErrorString(cudaError_t e) { (void)e; return "no error"; }
#endif

#include "ds4.h"

#ifdef DS4LAB_CPU_ONLY
#define DS4LAB_BACKEND DS4_BACKEND_CPU
#else
#define DS4LAB_BACKEND DS4_BACKEND_CUDA
#endif

typedef struct {
    ds4_engine *engine;
    ds4_session *session;
    cudaEvent_t start, stop;
    int ctx_size;
    char err[1024];
} ds4lab_handle;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cuda_fail(ds4lab_handle *h, const char *what, cudaError_t rc) {
    snprintf(h->err, sizeof h->err, "%s: %s (%s)", what, cudaGetErrorName(rc), cudaGetErrorString(rc));
    return -2;
}

const char *ds4lab_error(ds4lab_handle *h) { return h ? h->err : "no handle"; }

/* Open the engine and one session of ctx_size tokens on the CUDA back end. Returns NULL on failure,
 * with the reason in *err_out (a static buffer: read it before the next call).
 *
 * resident: ask ds4 for a layer slice of every layer and the output head (the options ds4's
 * distributed workers fill). At b0309611 the whole-model open (ds4_gpu_set_model_map_range) registers
 * the mapping for device access and reads every weight over PCIe, whatever DS4_CUDA_COPY_MODEL says;
 * the slice open goes through ds4_gpu_set_model_map, whose DS4_CUDA_COPY_MODEL branch copies the
 * model into GPU memory. ds4's log says which happened ("CUDA copying ... to device memory"). */
ds4lab_handle *ds4lab_open(const char *model_path, int ctx_size, int n_threads, int resident,
                           const char **err_out) {
    static char open_err[1024];
    ds4lab_handle *h = calloc(1, sizeof *h);
    if (!h) { snprintf(open_err, sizeof open_err, "out of host memory"); *err_out = open_err; return NULL; }
    ds4_engine_options opt;
    memset(&opt, 0, sizeof opt);
    opt.model_path = model_path;
    opt.backend = DS4LAB_BACKEND;
    opt.n_threads = n_threads;
    opt.context_size = ctx_size;
    if (resident) {
        opt.load_slice = true;
        opt.load_layer_start = 0;
        opt.load_layer_end = UINT32_MAX; /* ds4: the last executable layer */
        opt.load_output = true;
    }
    if (ds4_engine_open(&h->engine, &opt) != 0 || !h->engine) {
        snprintf(open_err, sizeof open_err, "ds4_engine_open(%s) failed: ds4's own message is on stderr",
                 model_path);
        free(h);
        *err_out = open_err;
        return NULL;
    }
    if (ds4_session_create(&h->session, h->engine, ctx_size) != 0 || !h->session) {
        snprintf(open_err, sizeof open_err, "ds4_session_create(ctx=%d) failed: ds4's own message is on stderr",
                 ctx_size);
        ds4_engine_close(h->engine);
        free(h);
        *err_out = open_err;
        return NULL;
    }
    cudaError_t rc = cudaEventCreate(&h->start);
    if (rc == cudaSuccess) rc = cudaEventCreate(&h->stop);
    if (rc != cudaSuccess) {
        snprintf(open_err, sizeof open_err, "cudaEventCreate: %s", cudaGetErrorName(rc));
        ds4_session_free(h->session);
        ds4_engine_close(h->engine);
        free(h);
        *err_out = open_err;
        return NULL;
    }
    h->ctx_size = ctx_size;
    *err_out = NULL;
    return h;
}

void ds4lab_close(ds4lab_handle *h) {
    if (!h) return;
    (void)cudaEventDestroy(h->start);
    (void)cudaEventDestroy(h->stop);
    if (h->session) ds4_session_free(h->session);
    if (h->engine) ds4_engine_close(h->engine);
    free(h);
}

int ds4lab_vocab_size(ds4lab_handle *h) { return ds4_engine_vocab_size(h->engine); }
int ds4lab_layer_count(ds4lab_handle *h) { return ds4_engine_layer_count(h->engine); }
int ds4lab_routed_quant_bits(ds4lab_handle *h) { return ds4_engine_routed_quant_bits(h->engine); }
int ds4lab_pos(ds4lab_handle *h) { return ds4_session_pos(h->session); }
int ds4lab_argmax(ds4lab_handle *h) { return ds4_session_argmax(h->session); }
unsigned long long ds4lab_model_bytes(ds4lab_handle *h) {
    return (unsigned long long)ds4_engine_model_bytes(h->engine);
}

/* Bring the session to the prompt prefix tokens[0:n] (ds4_session_sync: prefill of the suffix
 * when the live tokens are a prefix of it). Returns 0, or -1 with ds4's message. */
int ds4lab_sync(ds4lab_handle *h, const int *tokens, int n, double *seconds) {
    ds4_tokens prompt = {0};
    for (int i = 0; i < n; i++) ds4_tokens_push(&prompt, tokens[i]);
    const double t0 = now_s();
    int rc = ds4_session_sync(h->session, &prompt, h->err, sizeof h->err);
    cudaError_t crc = cudaDeviceSynchronize();
    *seconds = now_s() - t0;
    ds4_tokens_free(&prompt);
    if (rc != 0) return -1;
    if (crc != cudaSuccess) return cuda_fail(h, "cudaDeviceSynchronize after ds4_session_sync", crc);
    return 0;
}

/* One decode token, untimed: ds4_session_eval(token) and nothing of ds4lab's around it (the recorded
 * tokens: a trace of the token holds ds4's own calls only). Returns 0, or -1 with ds4's message. */
int ds4lab_eval(ds4lab_handle *h, int token) {
    return ds4_session_eval(h->session, token, h->err, sizeof h->err) != 0 ? -1 : 0;
}

/* One decode token: ds4_session_eval(token) between two CUDA events on the legacy stream.
 * gpu_ms: event to event (cudaEventElapsedTime, ms); host_s: the call's wall time on the host
 * (CLOCK_MONOTONIC, s), ds4's own synchronization at the end of a token included. */
int ds4lab_eval_timed(ds4lab_handle *h, int token, float *gpu_ms, double *host_s) {
#ifdef DS4LAB_CPU_ONLY
    const double c0 = now_s();
    const int ce = ds4_session_eval(h->session, token, h->err, sizeof h->err);
    *host_s = now_s() - c0;
    *gpu_ms = (float)(*host_s * 1e3);
    return ce != 0 ? -1 : 0;
#else
    cudaError_t rc = cudaEventRecord(h->start, 0);
    if (rc != cudaSuccess) return cuda_fail(h, "cudaEventRecord(start, legacy stream)", rc);
    const double t0 = now_s();
    const int e = ds4_session_eval(h->session, token, h->err, sizeof h->err);
    *host_s = now_s() - t0;
    if (e != 0) return -1;
    rc = cudaEventRecord(h->stop, 0);
    if (rc != cudaSuccess) return cuda_fail(h, "cudaEventRecord(stop, legacy stream)", rc);
    rc = cudaEventSynchronize(h->stop);
    if (rc != cudaSuccess) return cuda_fail(h, "cudaEventSynchronize(stop)", rc);
    rc = cudaEventElapsedTime(gpu_ms, h->start, h->stop);
    if (rc != cudaSuccess) return cuda_fail(h, "cudaEventElapsedTime", rc);
    return 0;
#endif
}
