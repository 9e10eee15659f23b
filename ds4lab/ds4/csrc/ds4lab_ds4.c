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
 * held to ds4's own code on a machine without a GPU, never to report a time.
 *
 * Whole-token capture (ds4lab_capture_mode): only with a build of ds4 that ds4lab rewrote
 * (ds4lab/ds4/rewrite.py: its accessor, setter and hooks, found here as weak symbols). The token is
 * bracketed by ds4's own ds4_gpu_begin_commands / ds4_gpu_end_commands: at the first, this driver
 * begins a stream capture on its own blocking stream and points the accessor at it; every launch,
 * cuBLAS call, memset and copy of the token lands there; at the second it ends the capture, updates
 * the executable graph of that token shape (cudaGraphExecUpdate; a refused update instantiates again)
 * and launches it, and ds4's own end-of-token synchronize follows. A call a capture cannot hold (ds4's
 * synchronizes, host reads, allocations: the rewrite's split hooks) ends the graph before it and
 * begins the next after it: the token is split there, and the call and ds4's line are counted.
 *
 * Mode 2 (stage 3, a build rewritten with ds4lab's stage 3: ds4lab_dry_* found as weak symbols): the token's
 * host code runs as a dry pass (nothing launched: each launch, cuBLAS call, memset, copy and event recorded,
 * the arguments that change between tokens written to a pinned staging block, everything else hashed into
 * the token's signature) with this driver's stream in a capture that must stay empty (work the rewrite did
 * not defer fails the token instead of running out of order). At the token's end the executable graph of
 * that signature is launched after one copy of the staging block to the device block the kernels read; a
 * signature never seen is made first, by capturing the recorded work replayed in order. No graph is ever
 * updated. A split ends the segment the same way; the next begins a new dry pass. */
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

/* ---- whole-token capture (a rewritten build only) ---------------------------------------------- */

/* The hooks the rewrite's prologue declares, from the one header both take their layout from. */
#include "ds4lab_hooks.h"
/* Stage 3's dry-pass state, from the header the stage-3 prologue also carries. */
#include "ds4lab_dry.h"

#define DS4LAB_SEGMENTS 32 /* graphs one token may be split into */
#define DS4LAB_SHAPES 64   /* executable graphs kept per segment: one per token shape */
#define DS4LAB_SHAPES_3U 8 /* of those, stage 3u uses the first 8 (its shape: the node count) */
#define DS4LAB_SLOT_BYTES (1u << 20)   /* stage 3: the token's argument slots (host staging and device) */
#define DS4LAB_ARENA_BYTES (32u << 20) /* stage 3: the dry pass's records */
#define DS4LAB_BREAKS 8    /* split calls named per token */
#define DS4LAB_TALLY 512   /* (kernel, argument) pairs whose value changed between tokens */

typedef struct {
    int segments;             /* graphs launched for the token */
    int splits;               /* calls the token was split around */
    int instantiated;         /* executable graphs made (a new shape, or a refused update) */
    int updated;              /* cudaGraphExecUpdate that succeeded */
    int update_refused;       /* cudaGraphExecUpdate that CUDA refused (then instantiated again) */
    long long nodes;          /* nodes in the token's graphs */
    long long kernel_nodes;   /* kernel nodes (ds4lab_capture_diff) */
    long long nodes_changed;  /* nodes whose parameters differ from the graph the exec held before */
    long long kernels_shape;  /* of those: kernel nodes of another function, grid, block or shared memory */
    long long kernels_uncompared; /* kernel nodes whose arguments could not be compared */
    int diffed_segments;      /* segments compared (an updated exec: its graph before and now) */
    char breaks[DS4LAB_BREAKS][64]; /* "call:line" of the first splits */
    int replayed;             /* stage 3: graphs launched whose signature was seen before (no capture) */
    long long records;        /* stage 3: launches and calls the dry pass recorded */
    long long moved;          /* stage 3: launches whose changing arguments were read from slots */
    long long slot_bytes;     /* stage 3: bytes of argument slots copied to the device */
} ds4lab_token_stats;

#ifndef DS4LAB_CPU_ONLY
typedef struct {
    cudaGraphExec_t exec;
    cudaGraph_t graph;        /* the graph the exec was last made or updated from */
    cudaGraph_t before;       /* the one before it (kept until compared) */
    size_t nodes;             /* the shape key: node count (3u) */
    unsigned long long sig;   /* the shape key: the dry pass's signature (3) */
    long long records;        /* ... and its record count */
    unsigned long long used;  /* last token that used it */
} ds4lab_exec;

typedef struct {
    const void *func;
    int param;
    long long changes;
} ds4lab_tally;

typedef struct {
    struct ds4lab_capture_hooks hooks;
    int mode;                 /* 0: eager; 1: whole token, re-captured, exec updated each token (3u); 2: dry pass (3) */
    unsigned char *slots_host; /* stage 3: pinned staging of the argument slots */
    void *slots_dev;          /* stage 3: the device block the kernels read them from */
    cudaStream_t stream;      /* blocking: eager work on the legacy stream between splits stays ordered */
    int armed, token, capturing, segment;
    unsigned long long tokens;
    ds4lab_exec execs[DS4LAB_SEGMENTS][DS4LAB_SHAPES];
    int seg_slot[DS4LAB_SEGMENTS];  /* the exec slot each segment of the last token used */
    ds4lab_token_stats st;
    ds4lab_tally tally[DS4LAB_TALLY];
    int ntally;
    char error[512];
} ds4lab_capture;
#endif

typedef struct {
    ds4_engine *engine;
    ds4_session *session;
    cudaEvent_t start, stop;
    int ctx_size;
    char err[1024];
#ifndef DS4LAB_CPU_ONLY
    ds4lab_capture cap;
#endif
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

static void capture_release(ds4lab_handle *h);
#ifndef DS4LAB_CPU_ONLY
static void arm(ds4lab_handle *h);
static int check_capture(ds4lab_handle *h);
#endif

void ds4lab_close(ds4lab_handle *h) {
    if (!h) return;
    capture_release(h);
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
#ifndef DS4LAB_CPU_ONLY
    arm(h);
    const int e = ds4_session_eval(h->session, token, h->err, sizeof h->err);
    const int cap = check_capture(h);
    return cap != 0 ? cap : (e != 0 ? -1 : 0);
#else
    return ds4_session_eval(h->session, token, h->err, sizeof h->err) != 0 ? -1 : 0;
#endif
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
    arm(h);
    const double t0 = now_s();
    const int e = ds4_session_eval(h->session, token, h->err, sizeof h->err);
    *host_s = now_s() - t0;
    const int cap = check_capture(h);
    if (cap != 0) return cap;
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

/* ds4_session_copy_logits: the last token's logits into out[0:cap]. Returns the count, or 0. */
int ds4lab_logits(ds4lab_handle *h, float *out, int cap) { return ds4_session_copy_logits(h->session, out, cap); }

#ifdef DS4LAB_CPU_ONLY
static void capture_release(ds4lab_handle *h) { (void)h; }
int ds4lab_rewritten(void) { return 0; }
int ds4lab_capture_mode(ds4lab_handle *h, int mode) {
    snprintf(h->err, sizeof h->err, "whole-token capture needs ds4's CUDA back end");
    return mode == 0 ? 0 : -4;
}
int ds4lab_capture_stats(ds4lab_handle *h, ds4lab_token_stats *out, int diff) {
    (void)h; (void)diff; memset(out, 0, sizeof *out); return 0;
}
int ds4lab_capture_tally(ds4lab_handle *h, int i, const char **name, int *param, long long *changes) {
    (void)h; (void)i; (void)name; (void)param; (void)changes; return -1;
}
#else
/* The rewrite's symbols: absent (NULL) in a build of ds4 as it ships. */
extern int ds4lab_rewrite_version(void) __attribute__((weak));
extern int ds4lab_capture_set_stream(cudaStream_t s, int on) __attribute__((weak));
extern void ds4lab_capture_set_hooks(const struct ds4lab_capture_hooks *hooks) __attribute__((weak));
/* Stage 3's (a build rewritten with ds4lab's stage 3 only). */
extern int ds4lab_dry_setup(void *host, unsigned long long dev, size_t cap, size_t arena) __attribute__((weak));
extern void ds4lab_dry_begin(int token) __attribute__((weak));
extern void ds4lab_dry_end(void) __attribute__((weak));
extern void ds4lab_dry_get(struct ds4lab_dry_state *out) __attribute__((weak));
extern int ds4lab_dry_replay(void) __attribute__((weak));

/* The rewrite's version in this build, or 0 for ds4 as it ships. */
int ds4lab_rewritten(void) { return ds4lab_rewrite_version ? ds4lab_rewrite_version() : 0; }

static void cap_fail(ds4lab_capture *c, const char *what, cudaError_t rc) {
    if (c->error[0]) return; /* the first failure is the one that explains the rest */
    snprintf(c->error, sizeof c->error, "%s: %s (%s)%s%s", what, cudaGetErrorName(rc), cudaGetErrorString(rc),
             c->st.splits ? "; first split at " : "", c->st.splits ? c->st.breaks[0] : "");
    (void)cudaGetLastError();
}

static void segment_begin(ds4lab_capture *c) {
    cudaError_t rc = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (rc != cudaSuccess) { cap_fail(c, "cudaStreamBeginCapture", rc); return; }
    c->capturing = 1;
}

/* The exec slot of segment k for a graph of n nodes (3u) or of signature sig and records records (3):
 * the one of the same shape, else a free one, else the least recently used (destroyed). */
static int exec_slot(ds4lab_capture *c, int k, size_t n, unsigned long long sig, long long records) {
    int free_slot = -1, lru = 0;
    const int shapes = c->mode == 2 ? DS4LAB_SHAPES : DS4LAB_SHAPES_3U;
    for (int i = 0; i < shapes; i++) {
        ds4lab_exec *e = &c->execs[k][i];
        if (e->exec && (c->mode == 2 ? e->sig == sig && e->records == records : e->nodes == n)) return i;
        if (!e->exec && free_slot < 0) free_slot = i;
        if (e->used < c->execs[k][lru].used) lru = i;
    }
    if (free_slot >= 0) return free_slot;
    ds4lab_exec *e = &c->execs[k][lru];
    (void)cudaGraphExecDestroy(e->exec);
    if (e->graph) (void)cudaGraphDestroy(e->graph);
    if (e->before) (void)cudaGraphDestroy(e->before);
    memset(e, 0, sizeof *e);
    return lru;
}

static void segment_end(ds4lab_capture *c) {
    if (!c->capturing) return;
    c->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t rc = cudaStreamEndCapture(c->stream, &g);
    char what[96];
    snprintf(what, sizeof what, "cudaStreamEndCapture (graph %d of the token)", c->segment + 1);
    if (rc != cudaSuccess || !g) { cap_fail(c, what, rc != cudaSuccess ? rc : cudaErrorUnknown); return; }
    size_t n = 0;
    rc = cudaGraphGetNodes(g, NULL, &n);
    if (rc != cudaSuccess) { cap_fail(c, "cudaGraphGetNodes", rc); (void)cudaGraphDestroy(g); return; }
    if (n == 0) { (void)cudaGraphDestroy(g); return; } /* nothing between two splits */
    const int k = c->segment;
    const int i = exec_slot(c, k, n, 0, 0);
    ds4lab_exec *e = &c->execs[k][i];
    c->seg_slot[k] = i;
    if (e->exec) {
        cudaGraphExecUpdateResultInfo info;
        rc = cudaGraphExecUpdate(e->exec, g, &info);
        if (rc == cudaSuccess) {
            c->st.updated++;
            if (e->before) (void)cudaGraphDestroy(e->before);
            e->before = e->graph;
            e->graph = g;
        } else {
            (void)cudaGetLastError();
            c->st.update_refused++;
            (void)cudaGraphExecDestroy(e->exec);
            e->exec = NULL;
        }
    }
    if (!e->exec) {
        rc = cudaGraphInstantiate(&e->exec, g, 0);
        if (rc != cudaSuccess) { cap_fail(c, "cudaGraphInstantiate", rc); e->exec = NULL; (void)cudaGraphDestroy(g); return; }
        c->st.instantiated++;
        if (e->before) (void)cudaGraphDestroy(e->before);
        if (e->graph) (void)cudaGraphDestroy(e->graph);
        e->before = NULL;
        e->graph = g;
        e->nodes = n;
    }
    e->used = c->tokens;
    rc = cudaGraphLaunch(e->exec, c->stream);
    if (rc != cudaSuccess) { cap_fail(c, "cudaGraphLaunch", rc); return; }
    c->st.segments++;
    c->st.nodes += (long long)n;
}

/* Stage 3: the dry pass of a segment begins; this driver's stream captures, and must capture nothing. */
static void dry_segment_begin(ds4lab_capture *c, int token) {
    segment_begin(c);
    ds4lab_dry_begin(token);
}

/* Stage 3: a graph of the recorded work, captured from its replay. Returns the exec, or NULL (failure said). */
static cudaGraphExec_t dry_make(ds4lab_capture *c, size_t *nodes) {
    cudaError_t rc = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (rc != cudaSuccess) { cap_fail(c, "cudaStreamBeginCapture (stage 3 replay)", rc); return NULL; }
    const int rrc = ds4lab_dry_replay();
    cudaGraph_t g = NULL;
    rc = cudaStreamEndCapture(c->stream, &g);
    struct ds4lab_dry_state ds;
    ds4lab_dry_get(&ds);
    if (rrc != 0) {
        char what[256];
        snprintf(what, sizeof what, "stage 3 replay of the dry pass: ds4_cuda.cu:%d: %s", ds.error_line, ds.error);
        cap_fail(c, what, cudaErrorUnknown);
        if (g) (void)cudaGraphDestroy(g);
        return NULL;
    }
    if (rc != cudaSuccess || !g) { cap_fail(c, "cudaStreamEndCapture (stage 3 replay)", rc != cudaSuccess ? rc : cudaErrorUnknown); return NULL; }
    cudaGraphExec_t x = NULL;
    rc = cudaGraphGetNodes(g, NULL, nodes);
    if (rc == cudaSuccess) rc = cudaGraphInstantiate(&x, g, 0);
    (void)cudaGraphDestroy(g);
    if (rc != cudaSuccess) { cap_fail(c, "cudaGraphInstantiate (stage 3)", rc); return NULL; }
    c->st.instantiated++;
    return x;
}

/* Stage 3: the segment's dry pass ends: its (empty) guard capture closes, the graph of its signature is found
 * or made, the slots it wrote are copied to the device and the graph launched, all on this driver's stream. */
static void dry_segment_end(ds4lab_capture *c) {
    ds4lab_dry_end(); /* first: a failed segment leaves no dry pass behind it */
    if (!c->capturing) return;
    c->capturing = 0;
    cudaGraph_t guard = NULL;
    cudaError_t rc = cudaStreamEndCapture(c->stream, &guard);
    size_t stray = 0;
    if (rc == cudaSuccess && guard) rc = cudaGraphGetNodes(guard, NULL, &stray);
    if (guard) (void)cudaGraphDestroy(guard);
    if (rc != cudaSuccess) { cap_fail(c, "cudaStreamEndCapture (stage 3 dry pass)", rc); return; }
    if (stray) {
        char what[160];
        snprintf(what, sizeof what, "%zu operations reached the stream in the dry pass without being deferred", stray);
        cap_fail(c, what, cudaErrorNotSupported);
        return;
    }
    struct ds4lab_dry_state ds;
    ds4lab_dry_get(&ds);
    if (ds.error[0]) {
        char what[256];
        snprintf(what, sizeof what, "stage 3 dry pass: ds4_cuda.cu:%d: %s", ds.error_line, ds.error);
        cap_fail(c, what, cudaErrorUnknown);
        return;
    }
    c->st.records += ds.records;
    c->st.moved += ds.moved;
    if (ds.records == 0) return;
    const int k = c->segment;
    const int i = exec_slot(c, k, 0, ds.signature, ds.records);
    ds4lab_exec *e = &c->execs[k][i];
    c->seg_slot[k] = i;
    size_t n = e->nodes;
    if (e->exec) {
        c->st.replayed++;
    } else {
        e->exec = dry_make(c, &n);
        if (!e->exec) return;
        e->sig = ds.signature;
        e->records = ds.records;
        e->nodes = n;
    }
    e->used = c->tokens;
    const size_t bytes = (size_t)(ds.slot_end - ds.slot_begin);
    if (bytes) {
        rc = cudaMemcpyAsync((unsigned char *)c->slots_dev + ds.slot_begin, c->slots_host + ds.slot_begin, bytes,
                             cudaMemcpyHostToDevice, c->stream);
        if (rc != cudaSuccess) { cap_fail(c, "cudaMemcpyAsync (stage 3 argument slots)", rc); return; }
        c->st.slot_bytes += (long long)bytes;
    }
    rc = cudaGraphLaunch(e->exec, c->stream);
    if (rc != cudaSuccess) { cap_fail(c, "cudaGraphLaunch", rc); return; }
    c->st.segments++;
    c->st.nodes += (long long)n;
}

static void hk_token_begin(void *ctx) {
    ds4lab_capture *c = ctx;
    if (!c->armed) return;
    c->armed = 0;
    c->token = 1;
    c->segment = 0;
    c->tokens++;
    memset(&c->st, 0, sizeof c->st);
    for (int k = 0; k < DS4LAB_SEGMENTS; k++) c->seg_slot[k] = -1;
    (void)ds4lab_capture_set_stream(c->stream, 1);
    if (c->mode == 2) dry_segment_begin(c, 1);
    else segment_begin(c);
}

static void hk_split_begin(void *ctx, const char *call, int line) {
    ds4lab_capture *c = ctx;
    if (!c->token) return;
    if (c->st.splits < DS4LAB_BREAKS) snprintf(c->st.breaks[c->st.splits], 64, "%s:%d", call, line);
    c->st.splits++;
    if (c->mode == 2) dry_segment_end(c);
    else segment_end(c);
}

static void hk_split_end(void *ctx) {
    ds4lab_capture *c = ctx;
    if (!c->token) return;
    if (c->segment + 1 >= DS4LAB_SEGMENTS) { cap_fail(c, "token split into too many graphs", cudaErrorNotSupported); return; }
    c->segment++;
    if (c->mode == 2) dry_segment_begin(c, 0);
    else segment_begin(c);
}

static void hk_token_end(void *ctx) {
    ds4lab_capture *c = ctx;
    if (!c->token) return;
    if (c->mode == 2) dry_segment_end(c);
    else segment_end(c);
    (void)ds4lab_capture_set_stream(NULL, 0);
    c->token = 0;
}

static int hk_token_active(void *ctx) { return ((ds4lab_capture *)ctx)->token; }

static void capture_release(ds4lab_handle *h) {
    ds4lab_capture *c = &h->cap;
    if (ds4lab_capture_set_hooks && c->hooks.ctx) ds4lab_capture_set_hooks(NULL);
    for (int k = 0; k < DS4LAB_SEGMENTS; k++)
        for (int i = 0; i < DS4LAB_SHAPES; i++) {
            ds4lab_exec *e = &c->execs[k][i];
            if (e->exec) (void)cudaGraphExecDestroy(e->exec);
            if (e->graph) (void)cudaGraphDestroy(e->graph);
            if (e->before) (void)cudaGraphDestroy(e->before);
            memset(e, 0, sizeof *e);
        }
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    c->stream = NULL;
    if (ds4lab_dry_setup && (c->slots_host || c->slots_dev)) (void)ds4lab_dry_setup(NULL, 0, 0, 0);
    if (c->slots_host) (void)cudaFreeHost(c->slots_host);
    if (c->slots_dev) (void)cudaFree(c->slots_dev);
    c->slots_host = NULL;
    c->slots_dev = NULL;
}

/* Stage 3's buffers: the slots' pinned staging and device block, and the dry pass's record arena. */
static int dry_setup(ds4lab_handle *h) {
    ds4lab_capture *c = &h->cap;
    if (!(ds4lab_dry_setup && ds4lab_dry_begin && ds4lab_dry_end && ds4lab_dry_get && ds4lab_dry_replay)) {
        snprintf(h->err, sizeof h->err, "stage 3 needs a build of ds4 with ds4lab's stage-3 rewrite "
                 "(this library has %s)", ds4lab_capture_set_stream ? "stage 0 only" : "no rewrite");
        return -4;
    }
    cudaError_t rc = cudaSuccess;
    if (!c->slots_host) rc = cudaMallocHost((void **)&c->slots_host, DS4LAB_SLOT_BYTES);
    if (rc != cudaSuccess) return cuda_fail(h, "cudaMallocHost (stage 3 argument slots)", rc);
    if (!c->slots_dev) rc = cudaMalloc(&c->slots_dev, DS4LAB_SLOT_BYTES);
    if (rc != cudaSuccess) return cuda_fail(h, "cudaMalloc (stage 3 argument slots)", rc);
    if (ds4lab_dry_setup(c->slots_host, (unsigned long long)(uintptr_t)c->slots_dev, DS4LAB_SLOT_BYTES,
                         DS4LAB_ARENA_BYTES) != 0) {
        snprintf(h->err, sizeof h->err, "stage 3: no host memory for the dry pass's records (%u bytes)",
                 DS4LAB_ARENA_BYTES);
        return -2;
    }
    return 0;
}

/* mode 0: ds4's tokens as they run (eager, or ds4's islands); mode 1: every token captured whole on
 * this driver's stream and replayed, its exec updated per token shape (stage 3u); mode 2: every token a
 * dry pass and the graph of its signature, never updated (stage 3). Hooks are per thread: call it on the
 * thread that evaluates. Returns 0, -1 for an unknown mode, or -4 when the build lacks the rewrite the mode
 * needs. */
int ds4lab_capture_mode(ds4lab_handle *h, int mode) {
    ds4lab_capture *c = &h->cap;
    if (mode < 0 || mode > 2) {
        snprintf(h->err, sizeof h->err, "capture mode %d: 0 (eager), 1 (3u) or 2 (3)", mode);
        return -1;
    }
    if (mode != 0 && !(ds4lab_capture_set_stream && ds4lab_capture_set_hooks)) {
        snprintf(h->err, sizeof h->err, "whole-token capture needs a build of ds4 with ds4lab's rewrite "
                 "(this library is ds4 as it ships)");
        return -4;
    }
    if (mode != 0 && !c->stream) {
        cudaError_t rc = cudaStreamCreate(&c->stream);
        if (rc != cudaSuccess) return cuda_fail(h, "cudaStreamCreate (capture stream)", rc);
    }
    if (mode == 2) {
        const int rc = dry_setup(h);
        if (rc != 0) return rc;
    }
    if (mode != 0) {
        c->hooks.token_begin = hk_token_begin;
        c->hooks.token_end = hk_token_end;
        c->hooks.split_begin = hk_split_begin;
        c->hooks.split_end = hk_split_end;
        c->hooks.token_active = hk_token_active;
        c->hooks.ctx = c;
        ds4lab_capture_set_hooks(&c->hooks);
    } else if (ds4lab_capture_set_hooks) {
        ds4lab_capture_set_hooks(NULL);
    }
    c->mode = mode;
    return 0;
}

static void arm(ds4lab_handle *h) {
    h->cap.armed = h->cap.mode != 0;
    h->cap.error[0] = 0;
}

/* After a token: a capture failure becomes the token's error (the work of a lost graph never ran). */
static int check_capture(ds4lab_handle *h) {
    ds4lab_capture *c = &h->cap;
    c->armed = 0;
    if (c->token) hk_token_end(c); /* ds4 returned without ending its commands (its own failure) */
    if (!c->error[0]) return 0;
    snprintf(h->err, sizeof h->err, "whole-token capture: %s", c->error);
    return -3;
}

static void tally(ds4lab_capture *c, const void *func, int param) {
    for (int i = 0; i < c->ntally; i++)
        if (c->tally[i].func == func && c->tally[i].param == param) { c->tally[i].changes++; return; }
    if (c->ntally < DS4LAB_TALLY) c->tally[c->ntally++] = (ds4lab_tally){func, param, 1};
}

/* Compare graph b (this token's) with a (the one its exec held before), node by node in capture
 * order: a node counts as changed when its type, kernel, grid, block, shared memory, arguments or
 * memset/copy parameters differ (what cudaGraphExecUpdate had to change). */
static void diff_graphs(ds4lab_capture *c, cudaGraph_t a, cudaGraph_t b) {
    size_t na = 0, nb = 0;
    if (cudaGraphGetNodes(a, NULL, &na) != cudaSuccess || cudaGraphGetNodes(b, NULL, &nb) != cudaSuccess || na != nb) {
        (void)cudaGetLastError();
        return;
    }
    cudaGraphNode_t *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B);
    if (!A || !B || cudaGraphGetNodes(a, A, &na) != cudaSuccess || cudaGraphGetNodes(b, B, &nb) != cudaSuccess) {
        free(A); free(B); (void)cudaGetLastError(); return;
    }
    c->st.diffed_segments++;
    for (size_t i = 0; i < na; i++) {
        enum cudaGraphNodeType ta, tb;
        if (cudaGraphNodeGetType(A[i], &ta) != cudaSuccess || cudaGraphNodeGetType(B[i], &tb) != cudaSuccess || ta != tb) {
            (void)cudaGetLastError(); c->st.nodes_changed++; continue;
        }
        if (ta == cudaGraphNodeTypeKernel) {
            struct cudaKernelNodeParams pa, pb;
            c->st.kernel_nodes++;
            if (cudaGraphKernelNodeGetParams(A[i], &pa) != cudaSuccess || cudaGraphKernelNodeGetParams(B[i], &pb) != cudaSuccess) {
                (void)cudaGetLastError(); c->st.kernels_uncompared++; continue;
            }
            if (pa.func != pb.func || pa.sharedMemBytes != pb.sharedMemBytes ||
                memcmp(&pa.gridDim, &pb.gridDim, sizeof pa.gridDim) || memcmp(&pa.blockDim, &pb.blockDim, sizeof pa.blockDim)) {
                c->st.nodes_changed++; c->st.kernels_shape++; continue;
            }
            if (!pa.kernelParams || !pb.kernelParams) { c->st.kernels_uncompared++; continue; }
            int changed = 0, known = 0;
            for (int k = 0; k < 256; k++) {
                size_t off = 0, sz = 0;
                if (cudaFuncGetParamInfo(pa.func, (size_t)k, &off, &sz) != cudaSuccess) { (void)cudaGetLastError(); break; }
                known = 1;
                if (memcmp(pa.kernelParams[k], pb.kernelParams[k], sz) != 0) { changed = 1; tally(c, pa.func, k); }
            }
            if (!known) c->st.kernels_uncompared++;
            if (changed) c->st.nodes_changed++;
        } else if (ta == cudaGraphNodeTypeMemset) {
            struct cudaMemsetParams ma, mb;
            if (cudaGraphMemsetNodeGetParams(A[i], &ma) == cudaSuccess && cudaGraphMemsetNodeGetParams(B[i], &mb) == cudaSuccess &&
                (ma.dst != mb.dst || ma.value != mb.value || ma.width != mb.width || ma.height != mb.height ||
                 ma.pitch != mb.pitch || ma.elementSize != mb.elementSize)) c->st.nodes_changed++;
            (void)cudaGetLastError();
        } else if (ta == cudaGraphNodeTypeMemcpy) {
            struct cudaMemcpy3DParms ca, cb;
            if (cudaGraphMemcpyNodeGetParams(A[i], &ca) == cudaSuccess && cudaGraphMemcpyNodeGetParams(B[i], &cb) == cudaSuccess &&
                memcmp(&ca, &cb, sizeof ca) != 0) c->st.nodes_changed++;
            (void)cudaGetLastError();
        }
    }
    free(A);
    free(B);
}

/* The last token's capture figures; with diff, each updated segment's graph is compared with the one
 * its exec held before (host work, so call it outside the timed token). Returns 0. */
int ds4lab_capture_stats(ds4lab_handle *h, ds4lab_token_stats *out, int diff) {
    ds4lab_capture *c = &h->cap;
    if (diff) {
        for (int k = 0; k < DS4LAB_SEGMENTS; k++) {
            if (c->seg_slot[k] < 0) continue;
            ds4lab_exec *e = &c->execs[k][c->seg_slot[k]];
            if (e->before && e->graph) {
                diff_graphs(c, e->before, e->graph);
                (void)cudaGraphDestroy(e->before);
                e->before = NULL;
            }
        }
    }
    *out = c->st;
    return 0;
}

/* The i-th (kernel, argument index) whose value changed between consecutive tokens, with the number
 * of changes over every compared token. Returns 0, or -1 past the end. */
int ds4lab_capture_tally(ds4lab_handle *h, int i, const char **name, int *param, long long *changes) {
    ds4lab_capture *c = &h->cap;
    if (i < 0 || i >= c->ntally) return -1;
    *name = "?";
    if (cudaFuncGetName(name, c->tally[i].func) != cudaSuccess) { (void)cudaGetLastError(); *name = "?"; }
    *param = c->tally[i].param;
    *changes = c->tally[i].changes;
    return 0;
}
#endif
