/*
 * dsopt: communication- and memory-efficient optimizers behind a C ABI.
 *
 * The caller owns the model, its parameters, its gradients and its
 * communicators; dsopt owns optimizer state. Every call that can fail returns
 * an int status (DSOPT_OK or a negative DSOPT_E* code); the detail of the
 * failure is in dsopt_last_error() on the same thread. A failed call leaves
 * everything as it was, with two exceptions that dsopt_step documents: a
 * DSOPT_ENONFINITE step was applied as a skipped step, and a step whose
 * communication failed after its update began marks the optimizer failed.
 *
 * Handles: one handle must not be used by two threads at once; separate
 * handles are independent.
 */
#ifndef DSOPT_H
#define DSOPT_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  define DSOPT_API __declspec(dllimport)
#elif defined(DSOPT_BUILDING_LIBRARY) && defined(__GNUC__)
#  define DSOPT_API __attribute__((visibility("default")))
#else
#  define DSOPT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Status and errors
 * ---------------------------------------------------------------------- */

/* Every call that can fail returns int: DSOPT_OK (0) or a negative code.
 * Codes are never renumbered. */
enum {
  DSOPT_OK           =  0,
  DSOPT_EINVAL       = -1, /* bad argument or bad config (null pointer, size, dtype, unknown key, bad value) */
  DSOPT_EUNSUPPORTED = -2, /* not built in (e.g. CUDA) or a combination that is not supported */
  DSOPT_ENOMEM       = -3, /* host or device allocation failed */
  DSOPT_EBUFS        = -4, /* caller's buffer too small */
  DSOPT_ECORRUPT     = -5, /* state blob truncated, wrong magic, bad checksum */
  DSOPT_EMISMATCH    = -6, /* blob of another algorithm/shape, or ranks disagree on config */
  DSOPT_ECOMM        = -7, /* MPI or NCCL failure */
  DSOPT_ECUDA        = -8, /* CUDA runtime failure */
  DSOPT_EINTERNAL    = -9,
  DSOPT_ENONFINITE   = -10 /* training is not progressing: max_consecutive_skips steps in a row were
                              skipped for Inf/NaN gradients, or fp16 gradients overflow at
                              min_loss_scale (see dsopt_step) */
};

/* Fixed text for a status code ("unknown status" for codes not listed above).
 * Never NULL; the string is static. */
DSOPT_API const char *dsopt_status_string(int status);

/* Detail of the last failure on the calling thread ("" when none). Never
 * NULL; the text stays valid until the next dsopt call on this thread. */
DSOPT_API const char *dsopt_last_error(void);

/* ------------------------------------------------------------------------
 * Versions
 * ---------------------------------------------------------------------- */

#define DSOPT_VERSION_MAJOR 0
#define DSOPT_VERSION_MINOR 1
#define DSOPT_VERSION_PATCH 0

/* MAJOR*10000 + MINOR*100 + PATCH of the loaded library. */
DSOPT_API int dsopt_version_number(void);

/* What the loaded library was built with, as space-separated key=value pairs,
 * e.g. "version=0.1.0 cuda=13.0 nccl=dlopen mpi=Open MPI 4.1.4 simd=avx512".
 * "simd" is the CPU kernel chosen at run time for this machine. Never NULL;
 * static storage. */
DSOPT_API const char *dsopt_build_info(void);

/* ------------------------------------------------------------------------
 * Tensors
 * ---------------------------------------------------------------------- */

enum { DSOPT_FLOAT32 = 0, DSOPT_FLOAT16 = 1, DSOPT_BFLOAT16 = 2 };

/* A flat, contiguous buffer. */
typedef struct dsopt_tensor {
  void   *data;    /* host or CUDA device memory, as the optimizer's "device" says */
  int64_t numel;   /* number of elements, > 0 */
  int32_t dtype;   /* DSOPT_FLOAT32 / FLOAT16 / BFLOAT16 */
  int32_t group;   /* parameter group index (see "param_groups"); ignored for gradients */
} dsopt_tensor;

/* ------------------------------------------------------------------------
 * Communicators (the MPI or NCCL communicator is borrowed, never freed)
 * ---------------------------------------------------------------------- */

typedef struct dsopt_comm dsopt_comm;
struct ncclComm;    /* same type as ncclComm_t points to */
struct CUstream_st; /* same type as cudaStream_t points to */

/* A world of one rank; no communication. *out is owned by the caller and
 * released with dsopt_comm_destroy. Returns DSOPT_OK, DSOPT_EINVAL (out is
 * NULL) or DSOPT_ENOMEM. Not collective. */
DSOPT_API int dsopt_comm_create_local(dsopt_comm **out);

/* Wraps an MPI communicator given by its Fortran handle (MPI_Comm_c2f(c) in
 * C, comm.py2f() in mpi4py). MPI must be initialised; the communicator is
 * borrowed until dsopt_comm_destroy and every optimizer created on it are
 * destroyed. Returns DSOPT_OK, DSOPT_EINVAL (out is NULL, MPI not
 * initialised, or the handle is not a communicator), DSOPT_EUNSUPPORTED (built
 * without MPI, or its MPI plugin libdsopt_mpi or the MPI library it needs
 * cannot be loaded: libdsopt is not linked to MPI and loads them here; the
 * message says what to install) or DSOPT_ENOMEM. Not collective. dsopt's collectives run on a
 * duplicate of the communicator (MPI_Comm_dup, made by the first collective
 * dsopt call on it, usually dsopt_create) whose error handler is
 * MPI_ERRORS_RETURN: a failing MPI call returns DSOPT_ECOMM with MPI's error
 * text instead of aborting. The caller's communicator and its error handler
 * are left as they are; dsopt_comm_destroy frees the duplicate. After
 * DSOPT_ECOMM the dsopt_comm is not used again (every later call on it
 * returns DSOPT_ECOMM): MPI may still have operations of the failed call
 * posted, which can write into that call's buffers (the caller's parameters
 * or gradients included) until MPI_Finalize; dsopt never frees its own. */
DSOPT_API int dsopt_comm_create_mpi(dsopt_comm **out, int64_t mpi_comm_f);

/* Wraps an NCCL communicator and the CUDA stream all of dsopt's device work
 * and communication on it runs on (NULL: the legacy default stream). Both are
 * borrowed. NCCL is loaded (dlopen "libnccl.so.2") on the first call.
 * Returns DSOPT_OK, DSOPT_EINVAL (out or comm is NULL),
 * DSOPT_EUNSUPPORTED (built without CUDA/NCCL, or NCCL cannot be loaded),
 * DSOPT_ECOMM or DSOPT_ENOMEM. Not collective. */
DSOPT_API int dsopt_comm_create_nccl(dsopt_comm **out, struct ncclComm *comm,
                                     struct CUstream_st *stream);

/* ------------------------------------------------------------------------
 * Custom communicators: the caller's own collectives (torch.distributed,
 * MPI.jl, HCCL, a custom runtime) behind a table of callbacks
 * ---------------------------------------------------------------------- */

/* Element types, reductions and buffer locations the callbacks receive. */
enum {
  DSOPT_COMM_FLOAT32 = 0,
  DSOPT_COMM_FLOAT64 = 1,
  DSOPT_COMM_INT32   = 2,
  DSOPT_COMM_INT64   = 3,
  DSOPT_COMM_UINT8   = 4
};
enum { DSOPT_COMM_SUM = 0, DSOPT_COMM_MAX = 1 };
enum { DSOPT_COMM_HOST = 0, DSOPT_COMM_CUDA = 1 };

/* dsopt_comm_ops.flags: the callbacks may be called from a thread dsopt
 * starts while the caller's own threads use dsopt and the runtime (needed
 * for dsopt_grad_ready to overlap reductions with the backward pass). */
#define DSOPT_COMM_CONCURRENT 1u

/* The collectives dsopt needs, as functions of the caller. Each is
 * collective: every rank calls it, in the same order, with the same count,
 * elem, op and device, one at a time per communicator. Counts are elements
 * of `elem`, > 0. `device` says where both buffers live (DSOPT_COMM_HOST or
 * DSOPT_COMM_CUDA). send and recv never overlap, except that allreduce may be
 * called in place (send == recv). Each returns 0, or any other value for a
 * failure: dsopt then fails the call with DSOPT_ECOMM, the text of
 * error_message (when given) in dsopt_last_error(), and never calls the
 * communicator again. A callback must return, with a failure if need be,
 * rather than wait forever for a rank that failed (a timeout, as gloo and
 * NCCL have): that is what lets every rank return an error instead of
 * hanging.
 *
 * Host buffers are valid only during the call; the collective must have
 * finished when the callback returns. Device buffers: dsopt has queued the
 * work that fills `send` on `stream`, and queues the work that reads `recv`
 * on `stream` after the callback returns; the callback either finishes the
 * collective before returning or orders it on `stream` (its reads after the
 * work already queued there, later work on `stream` after its writes), and
 * keeps no reference to either buffer afterwards.
 *
 * Where the buffers are host memory, dsopt computes every floating-point
 * sum over ranks itself, in a fixed order, from alltoall and allgather
 * (allreduce and reduce_scatter then see only integer sums and maxima, which
 * are exact): results do not depend on the runtime and are bit-identical to
 * dsopt_comm_create_mpi's. On device buffers sums are the runtime's. */
typedef struct dsopt_comm_ops {
  uint32_t struct_size;       /* caller sets sizeof(dsopt_comm_ops) */
  uint32_t flags;             /* 0 or DSOPT_COMM_CONCURRENT */
  int32_t  rank;              /* this process's rank, 0 <= rank < size */
  int32_t  size;              /* number of ranks, >= 1 */
  struct CUstream_st *stream; /* the CUDA stream dsopt's device work on this communicator
                                 runs on (NULL: the legacy default stream); unused on host */
  /* recv[i] = op over ranks of send[i], i < count. */
  int (*allreduce)(const void *send, void *recv, size_t count, int32_t elem, int32_t op,
                   int32_t device, void *user);
  /* send holds size*count elements; rank r receives in recv the op over
   * ranks of block r (elements r*count .. (r+1)*count-1). */
  int (*reduce_scatter)(const void *send, void *recv, size_t count, int32_t elem, int32_t op,
                        int32_t device, void *user);
  /* recv holds size*count elements: block r is rank r's send. */
  int (*allgather)(const void *send, void *recv, size_t count, int32_t elem, int32_t device,
                   void *user);
  /* send and recv hold size*count elements: block j of send goes to rank j,
   * block i of recv came from rank i. */
  int (*alltoall)(const void *send, void *recv, size_t count, int32_t elem, int32_t device,
                  void *user);
  /* Text for a failure a callback returned (may be NULL). The string must
   * stay valid until the next callback on this communicator. */
  const char *(*error_message)(int code, void *user);
  /* Called once by dsopt_comm_destroy (may be NULL): the caller releases
   * `user` there. Not called when dsopt_comm_create_custom fails. */
  void (*release)(void *user);
} dsopt_comm_ops;

/* A communicator whose collectives are the callbacks in *ops, each given
 * `user`. *ops is copied; `user` is borrowed until dsopt_comm_destroy.
 * Returns DSOPT_OK, DSOPT_EINVAL (out or ops NULL, struct_size short of
 * the required callbacks, a required callback missing, rank or size out of
 * range, unknown flags) or DSOPT_ENOMEM. Not collective. An optimizer with
 * "device": "cuda" runs its device work on ops->stream. */
DSOPT_API int dsopt_comm_create_custom(dsopt_comm **out, const dsopt_comm_ops *ops, void *user);

/* Rank and size of the communicator; -1 for NULL. */
DSOPT_API int dsopt_comm_rank(const dsopt_comm *comm);
DSOPT_API int dsopt_comm_size(const dsopt_comm *comm);

/* Releases the wrapper (never the MPI/NCCL communicator; a custom one's
 * ops->release is called). NULL is fine. Must outlive every optimizer
 * created on it. */
DSOPT_API void dsopt_comm_destroy(dsopt_comm *comm);

/* ------------------------------------------------------------------------
 * Optimizer
 * ---------------------------------------------------------------------- */

typedef struct dsopt_optimizer dsopt_optimizer;

typedef struct dsopt_step_info {
  uint32_t struct_size;  /* caller sets sizeof(dsopt_step_info); fields past it are not written */
  int32_t  skipped;      /* 1 when this step was skipped (gradient overflow) */
  int32_t  compressed;   /* 1 when this step used 1-bit compressed communication */
  int32_t  reserved;
  int64_t  step;         /* updates applied so far, this one included; skipped steps do not count */
  double   loss_scale;   /* loss scale to use for the next backward; 1.0 when loss scaling is off */
  double   grad_norm;    /* global gradient norm before clipping; -1.0 without clipping and
                            without "report_grad_norm" */
  uint64_t bytes_sent;   /* bytes this rank sent through the communicator during this step */
  int64_t  consecutive_skips; /* steps skipped in a row, this one included; 0 when this step applied */
  int32_t  phase;        /* what this step did: one of DSOPT_PHASE_* below */
  int32_t  reserved2;
  int32_t  grads_replicated; /* 1 when every rank's local gradients were bit-identical (and not
                                all zero): something else, e.g. DistributedDataParallel, had
                                averaged them already and dsopt averaged them again. Checked on
                                the run's first 3 steps only (see below); 0 on the others and at
                                one rank */
  int32_t  diverging;    /* 1 while the run's global gradient norm stays far above its own recent
                            history (see below): a divergence whose values are all finite, so
                            that no step is skipped; 0 otherwise and with "divergence_check"
                            off. Every rank reports the same */
} dsopt_step_info;

/* dsopt_step_info.phase. Callers built against an older header pass a
 * smaller struct_size and never see it (nor grads_replicated).
 * grads_replicated: while the run has applied fewer than 3 steps (skipped
 * steps do not count; a run resumed from a blob counts from its steps),
 * each rank hashes samples of its local gradients (the first and last KiB
 * of each) and one 16-byte allreduce compares the hashes; later steps
 * compute and send nothing for it.
 * diverging (callers built before it read reserved3, always 0): with x =
 * ln(global gradient norm) and r a running mean of x (the mean of the first
 * 50 steps, then an exponential average over 50, each x clamped to r +-
 * ln 2; one r for steps with averaged gradients, one for steps whose
 * gradients stayed local at several ranks), a step is above when
 * x - r > ln(20) after 10 steps; diverging becomes 1 once 3 of the last 8
 * steps were above and stays 1, skipped steps included, until 8 in a row
 * were not. "divergence_check" in the config tunes or turns off the rule
 * (docs/reference/c-api.md "Divergence that stays finite"); its state is part of the state
 * blob. */
#define DSOPT_PHASE_SKIPPED    0 /* the step was skipped: nothing applied */
#define DSOPT_PHASE_FULL       1 /* full-precision averaged gradients: Adam, 1-bit Adam's warmup,
                                    0/1 Adam's variance-update steps */
#define DSOPT_PHASE_COMPRESSED 2 /* 1-bit compressed communication: 1-bit Adam's compression stage,
                                    0/1 Adam's 1-bit gradient steps (before var_freeze_step) */
#define DSOPT_PHASE_LOCAL      3 /* 0/1 Adam local step: no communication of gradients or momenta */
#define DSOPT_PHASE_SYNC       4 /* 0/1 Adam local step followed by the 1-bit sync of the accumulator */

/* Creates an optimizer for `num_params` parameters described by `params`
 * (docs/reference/config.md: the JSON config). The parameter buffers are borrowed
 * until dsopt_destroy and updated in place, each its own memory: two
 * parameters whose bytes overlap (the same buffer twice, or overlapping
 * views) are DSOPT_EINVAL naming both; `comm` is borrowed until
 * dsopt_destroy. *out is released with dsopt_destroy.
 * Collective: every rank of `comm` calls it; all ranks must pass the same
 * config and the same parameter shapes, dtypes and groups, else every rank
 * fails with DSOPT_EMISMATCH (a rank with a local error returns that error,
 * the others DSOPT_EMISMATCH).
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_EUNSUPPORTED, DSOPT_EMISMATCH,
 * DSOPT_ENOMEM, DSOPT_ECOMM, DSOPT_ECUDA. */
DSOPT_API int dsopt_create(dsopt_optimizer **out, const char *config_json, dsopt_comm *comm,
                           const dsopt_tensor *params, int64_t num_params);

/* Points the optimizer at new storage for its parameters (the caller moved
 * them: a framework copied the model, a tensor got new memory): `params`
 * describes every parameter again, in order, with the numel, dtype and
 * group given to dsopt_create, data on the optimizer's device. Nothing else
 * changes: the next step updates the new buffers in place, and the fp32
 * masters of 16-bit parameters stay dsopt's (the next step writes the
 * rounded masters into the new buffers), so a run whose values were copied
 * into new buffers continues bit-identically. The old buffers are not used
 * again and may be freed once this returns. Not collective (each rank
 * rebinds its own memory). Returns DSOPT_OK or DSOPT_EINVAL (NULL pointers,
 * another count, numel, dtype, group or device, naming the parameter;
 * overlapping storage, naming both; or
 * gradients being handed over with dsopt_grad_ready); nothing changes on
 * failure. */
DSOPT_API int dsopt_rebind_params(dsopt_optimizer *opt, const dsopt_tensor *params,
                                  int64_t num_params);

/* Applies one step with this rank's local gradients (mean over its local
 * micro-batches, multiplied by the loss scale when fp16 loss scaling is on):
 * one per parameter, same order and numel; dtypes may differ from the
 * parameters'. Gradients are only read, during the call. `info` may be NULL;
 * if not, info->struct_size must be set.
 * Collective. If any rank passes invalid arguments, every rank fails (that
 * rank with its own message, the others with DSOPT_EINVAL naming the rank)
 * and nothing changes. A step with a non-finite gradient on any rank is
 * skipped on every rank (info->skipped = 1) and returns DSOPT_OK, unless the
 * run has stopped progressing: when "max_consecutive_skips" (default 50; 0
 * turns this off) steps in a row have been skipped, or when fp16 dynamic
 * loss scaling overflows with the scale already at min_loss_scale, the
 * skipped step returns DSOPT_ENONFINITE on every rank, with a message that
 * says what happened and what to try. That step was skipped exactly like
 * one that returns DSOPT_OK (info is written, the loss scaler saw the
 * overflow); the next dsopt_step may continue the run.
 * Every collective call (dsopt_step, dsopt_state_load,
 * dsopt_state_load_shards) starts with a 16-byte handshake: when the ranks
 * are in different calls, every rank returns DSOPT_EMISMATCH and nothing
 * changes.
 * A failed collective (DSOPT_ECOMM): when it comes before the update (the
 * handshake, the gradient reduction, the norm and status exchange) nothing
 * changes. When it comes inside the update (ZeRO-1/2's parameter
 * allgather; the compressed exchange of 1-bit Adam's and 1-bit LAMB's
 * compression stage and of 0/1 Adam's 1-bit and sync steps) the optimizer
 * is marked failed: every later dsopt_step, dsopt_grad_ready,
 * dsopt_state_size, dsopt_state_save, dsopt_get_state_view and
 * dsopt_state_load* returns DSOPT_ECOMM saying that the state is
 * inconsistent; destroy it and, on every rank, create a new communicator
 * and optimizer and load the last saved state. Adam/AdamW without ZeRO and
 * 0/1 Adam's local steps never fail half-way. docs/robustness.md lists the
 * failure points of each step.
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_EMISMATCH, DSOPT_ECOMM, DSOPT_ECUDA,
 * DSOPT_ENOMEM, DSOPT_ENONFINITE. */
/* grads == NULL with num_grads == 0 completes a step whose gradients were
 * handed over with dsopt_grad_ready (below). grads == NULL with num_grads
 * < 0 abandons the step on this rank (its gradients cannot be used, e.g. a
 * binding could not describe one): the call still takes part in the
 * step's collectives, in the form of a handed-over step when gradients are
 * being handed over or the previous step was one, and every rank returns
 * DSOPT_EINVAL (the others naming this rank); nothing changes.
 *
 * Absent gradients: a gradient whose `data` is NULL says "no gradient for
 * this parameter in this step on this rank" (a parameter that is frozen, or
 * that the step's forward pass did not use); its numel and dtype are not
 * read. The ranks agree on which gradients are absent (one small allreduce,
 * made only when some rank has one):
 *  - absent on some ranks only: those ranks contribute zeros to the average
 *    (over all ranks, as under data parallelism), and the parameter is
 *    updated as usual;
 *  - Adam/AdamW (any ZeRO stage), absent on every rank: the parameter is
 *    not updated. Its values, moments and step count (dsopt_get_param_step)
 *    stay as they are and weight decay is not applied, as torch.optim does
 *    for a parameter whose .grad is None. Each parameter counts its own
 *    updates, and its bias correction uses that count;
 *  - 1-bit Adam, 1-bit LAMB, 0/1 Adam: an absent gradient is a zero
 *    gradient, and every parameter takes part in every step (momentum,
 *    weight decay, the compressed exchange and its error feedback span all
 *    parameters): a parameter without gradients keeps moving with its
 *    momentum, as under DeepSpeed's engine. Leave parameters that stay
 *    frozen out of these optimizers.
 * info->step counts the steps applied, whatever was absent. */
DSOPT_API int dsopt_step(dsopt_optimizer *opt, const dsopt_tensor *grads, int64_t num_grads,
                         dsopt_step_info *info /* may be NULL */);

/* Hands over parameter `param_index`'s local gradient of one micro-batch
 * while backward is still running, so that its reduction overlaps the rest
 * of backward; dsopt_step(opt, NULL, 0, info) then completes the step. Works
 * for every optimizer and ZeRO stage 0, 1 and 2.
 *
 * Buffer: `grad` (numel of the parameter, any float dtype, on the
 * parameters' device) is read completely before the call returns: the caller
 * may reuse or free it at once (one gradient buffer can serve every
 * parameter). dsopt keeps the gradients in its own fp32 buffers: stage 0 and
 * stage 1 one for all parameters; stage 2 a few reduce buckets
 * ("reduce_bucket_size"), released as their reductions finish.
 *
 * Micro-batches: with "gradient_accumulation_steps" = G (default 1) each
 * parameter is handed over G times per step, once per micro-batch, and the
 * step uses the mean of the G gradients: stage 0 and 1 sum them locally in
 * fp32 and reduce once, in the last micro-batch; stage 2 reduces every
 * micro-batch into the shard and sums the reduced shards in fp32. The
 * average over ranks and micro-batches is one multiplication by
 * fl(1/(P*G)). A second hand-over of a parameter in the same micro-batch
 * starts the next micro-batch.
 *
 * Order: any order, and it may differ between ranks. Gradients are packed
 * into reduce buckets in parameter order; a bucket's reduction starts once
 * the bucket is complete and every bucket after it has started, so buckets
 * are reduced from the last to the first on every rank. Handing over in
 * reverse parameter order (autograd's usual order) overlaps best.
 *
 * A parameter that gets no gradient in a micro-batch (not handed over before
 * the next micro-batch starts or before dsopt_step) contributes zeros, like
 * a rank without a gradient under data parallelism. A parameter that no
 * rank handed over in any micro-batch of the step is absent on every rank,
 * as a NULL gradient in dsopt_step is (Adam/AdamW do not update it; see
 * dsopt_step). Every rank must still call dsopt_step(opt, NULL, 0, ...) for
 * the step; a rank that handed nothing over contributes zeros.
 *
 * The non-finite check runs here, on each gradient as it is read; a
 * non-finite gradient makes the step skipped on every rank, as in
 * dsopt_step.
 *
 * Results are bit-identical to passing the same gradients (G = 1) to
 * dsopt_step at once, at every stage: dsopt_step runs the same buckets.
 *
 * Threads: call it from one thread at a time per optimizer. Reductions run
 * on a dsopt thread when the communicator allows concurrent calls (MPI
 * initialised with MPI_THREAD_MULTIPLE, as mpi4py does by default);
 * otherwise, and on NCCL, a bucket's reduction runs inside the call that
 * completes it (correct, without overlap).
 *
 * Collective only through dsopt_step: the first hand-over of a step starts a
 * 16-byte handshake (DSOPT_EMISMATCH from dsopt_step when the ranks are in
 * different calls). Errors: DSOPT_EINVAL for a NULL handle or grad, an index
 * out of range, a numel or dtype that does not fit, or a parameter handed over G times already in this step; nothing
 * changes then. dsopt_step with gradients, dsopt_state_load(_ex),
 * dsopt_state_load_shards or dsopt_rebind_params while gradients are handed
 * over is DSOPT_EINVAL on that rank, changing nothing. A communication error of a
 * reduction is returned by dsopt_step (DSOPT_ECOMM).
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_ECOMM, DSOPT_ECUDA, DSOPT_ENOMEM. */
DSOPT_API int dsopt_grad_ready(dsopt_optimizer *opt, int64_t param_index, const dsopt_tensor *grad);

/* Sets the learning rate of every parameter group (for LR schedules).
 * Returns DSOPT_OK or DSOPT_EINVAL (NULL handle, lr negative or not finite).
 * Not collective; call it with the same value on every rank. */
DSOPT_API int dsopt_set_lr(dsopt_optimizer *opt, double lr);

/* "gradient_clipping" (the global gradient norm's limit; 0: off) from the
 * next step on, as frameworks that own the clipping setting need
 * (max_grad_norm, gradient_clip_val). Returns DSOPT_OK or DSOPT_EINVAL (NULL
 * handle, negative or not finite, or gradients handed over for the step in
 * progress). Not collective; call it with the same value on every rank
 * between the same steps (the ranks' steps must agree on clipping). */
DSOPT_API int dsopt_set_gradient_clipping(dsopt_optimizer *opt, double max_norm);
DSOPT_API int dsopt_get_gradient_clipping(const dsopt_optimizer *opt, double *out_max_norm);

/* The CPU threads of the optimizer's host work: the config's "threads", or
 * by default this process's share of the cores it may run on (its CPU
 * affinity mask) among the ranks of its communicator on the same machine
 * and cores, at least 1; OMP_NUM_THREADS, when set, is taken as this
 * process's choice instead (capped by the mask). Returns DSOPT_OK or
 * DSOPT_EINVAL. Not collective. */
DSOPT_API int dsopt_get_threads(const dsopt_optimizer *opt, int32_t *out_threads);

/* Size in bytes of the blob dsopt_state_save writes now.
 * Returns DSOPT_OK, DSOPT_EINVAL, or DSOPT_ECOMM when the optimizer is
 * marked failed (see dsopt_step). Not collective. */
DSOPT_API int dsopt_state_size(const dsopt_optimizer *opt, uint64_t *out_size);

/* Writes this rank's whole optimizer state into dst (caller-owned,
 * `capacity` bytes) as one self-describing, checksummed blob; *out_written
 * (may be NULL) receives its size. Not collective.
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_EBUFS (capacity too small: nothing
 * written, *out_written set to the size needed), DSOPT_ECUDA, DSOPT_ECOMM
 * (the optimizer is marked failed, see dsopt_step: its state is not
 * saved). */
DSOPT_API int dsopt_state_save(const dsopt_optimizer *opt, void *dst, uint64_t capacity,
                               uint64_t *out_written);

/* Restores the state saved by dsopt_state_save from an optimizer created
 * with the same config and parameter shapes. The blob is validated
 * completely before anything changes. Saved at another world size:
 * replicated state loads as is, rank-local state resets (docs/guides/checkpoints.md).
 * Saved at this world size by another rank: replicated state (Adam/AdamW
 * without ZeRO, the 1-bit optimizers before their compression) loads as
 * is; a blob that holds rank-local state of the rank that saved it (1-bit
 * Adam's and 1-bit LAMB's compression errors, 0/1 Adam's errors and
 * accumulator, a ZeRO shard) is DSOPT_EMISMATCH, with a message that says
 * what to load instead. Master weights kept by dsopt are restored and
 * written back into the caller's 16-bit parameters. Collective: when any
 * rank fails, every rank fails and nothing changes.
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_ECORRUPT (truncated, wrong magic or
 * version, bad checksum), DSOPT_EMISMATCH (another algorithm, shapes or
 * config, another rank's rank-local state), DSOPT_ECUDA, DSOPT_ECOMM (also
 * when the optimizer is marked failed, see dsopt_step: load into a new one). */
DSOPT_API int dsopt_state_load(dsopt_optimizer *opt, const void *src, uint64_t size);

/* dsopt_state_load_ex flags: where a rank's blob holds another rank's
 * rank-local state (see dsopt_state_load), load its replicated state and
 * reset the rank-local state as a load at another world size does, on
 * every rank (the ranks' rank-local states must fit together). The 1-bit
 * optimizers only: a ZeRO shard is the state itself and is still
 * DSOPT_EMISMATCH. */
#define DSOPT_LOAD_RESET_RANK_LOCAL 1u

/* dsopt_state_load with `flags` (0 or DSOPT_LOAD_RESET_RANK_LOCAL; 0 is
 * dsopt_state_load). *out_reset (may be NULL) is set to 1 when rank-local
 * state was reset, else 0; on every rank alike. Collective.
 * Returns what dsopt_state_load returns; DSOPT_EINVAL also for unknown
 * flags. */
DSOPT_API int dsopt_state_load_ex(dsopt_optimizer *opt, const void *src, uint64_t size,
                                  uint32_t flags, int32_t *out_reset);

/* Restores the state of a run saved at any world size, from the blobs its
 * ranks wrote: every rank passes all `num_blobs` blobs in old-rank order
 * (blobs[i] from old rank i, sizes[i] bytes). All of them are validated
 * before anything changes: same algorithm and parameter shapes, one save of
 * one run (same run, step counters, learning rates and loss scaler), each
 * rank exactly once. Adam/AdamW at any ZeRO stage reshard: the ZeRO shards
 * (or the replicated state of a stage-0 run) are cut by interval
 * intersection in parameter order into this rank's shard, so 2 -> 4, 4 -> 3
 * or stage 0 -> stage 2 continue as an uninterrupted run at the new size
 * would from the same state. The other optimizers have replicated state:
 * this rank's own blob at the same world size, else blobs[0], as
 * dsopt_state_load would (a single blob another rank of this world size
 * saved, holding its rank-local state, is DSOPT_EMISMATCH). A single blob (one replica of replicated state, or
 * the blob of a one-rank run) is a complete set. Collective.
 * Returns DSOPT_OK, DSOPT_EINVAL (NULL pointers, num_blobs < 1),
 * DSOPT_ECORRUPT, DSOPT_EMISMATCH (another algorithm or shapes, a missing,
 * duplicated or misordered blob, blobs of different runs or steps),
 * DSOPT_ECUDA. */
DSOPT_API int dsopt_state_load_shards(dsopt_optimizer *opt, const void *const *blobs,
                                      const uint64_t *sizes, int64_t num_blobs);

/* Releases the optimizer and its state; the borrowed parameters and the
 * communicator are left alone. NULL is fine. Collective. */
DSOPT_API void dsopt_destroy(dsopt_optimizer *opt);

/* Sets the momentum mask of parameter `param_index` for 1-bit optimizers
 * (DeepSpeed's exp_avg_mask): after every compressed step the decompressed
 * momentum is multiplied by it elementwise, so coordinates whose gradient is
 * always zero stay zero. `mask` has the parameter's numel, dtype
 * DSOPT_FLOAT32 and lives on the optimizer's device; dsopt copies it (the
 * caller's buffer is not kept). NULL clears the mask. Masks are not part of
 * the state blob. Not collective; set the same masks on every rank.
 * Returns DSOPT_OK, DSOPT_EINVAL (NULL handle, index out of range, wrong
 * numel, dtype or device, or a parameter of a non_freeze group, whose
 * momentum is never compressed) or DSOPT_EUNSUPPORTED (the optimizer has no
 * momentum mask, e.g. Adam). */
DSOPT_API int dsopt_set_momentum_mask(dsopt_optimizer *opt, int64_t param_index,
                                      const dsopt_tensor *mask);

/* --- extensions ------------------------------------------------------- */

/* Number of parameter groups (1 when the config has no "param_groups").
 * Returns DSOPT_OK or DSOPT_EINVAL. */
DSOPT_API int dsopt_num_groups(const dsopt_optimizer *opt, int32_t *out_count);

/* Learning rate of one group. Returns DSOPT_OK or DSOPT_EINVAL (NULL
 * pointer, group out of range). */
DSOPT_API int dsopt_get_lr(const dsopt_optimizer *opt, int32_t group, double *out_lr);

/* Sets the learning rate of one group (per-group LR schedules).
 * Returns DSOPT_OK or DSOPT_EINVAL. Not collective; same value on every rank. */
DSOPT_API int dsopt_set_group_lr(dsopt_optimizer *opt, int32_t group, double lr);

/* Hyperparameters of one group by name: "lr", "beta1", "beta2", "eps",
 * "weight_decay". A value set takes effect from the next step on (for
 * schedules that change momentum or decay, e.g. OneCycleLR's beta1 cycle)
 * and is part of the state blob. Valid values: lr, eps and weight_decay
 * finite and >= 0, betas in [0, 1) and below 1 in fp32 (at most
 * 0.99999994: the update runs in fp32). The 1-bit optimizers read beta2 and eps
 * also during their compression stage (the frozen variance stays as it
 * is). Not collective; set the same values on every rank.
 * Returns DSOPT_OK or DSOPT_EINVAL (NULL pointer, group out of range,
 * unknown name, invalid value; nothing changes). */
DSOPT_API int dsopt_get_group_param(const dsopt_optimizer *opt, int32_t group, const char *name,
                                    double *out_value);
DSOPT_API int dsopt_set_group_param(dsopt_optimizer *opt, int32_t group, const char *name,
                                    double value);

/* Where dsopt keeps part of one parameter's optimizer state. */
typedef struct dsopt_state_view {
  uint32_t     struct_size; /* caller sets sizeof(dsopt_state_view) */
  int32_t      device;      /* DSOPT_COMM_HOST or DSOPT_COMM_CUDA: where tensor.data lives */
  dsopt_tensor tensor;      /* fp32 elements in dsopt's own buffer (tensor.group: the parameter's
                               group); data NULL and numel 0 when this rank holds none of them */
  int64_t      offset;      /* index within the parameter of the first element tensor.data holds */
  int64_t      param_numel; /* the parameter's numel */
} dsopt_state_view;

/* The state tensor `name` of parameter `param_index`, as a view of dsopt's
 * own memory (no copy). Names (dsopt_state_names lists an optimizer's):
 * every optimizer: "exp_avg", "exp_avg_sq", and "master" (the fp32 master
 * weights of a 16-bit parameter; not for fp32 parameters, which are their
 * own masters); 1-bit Adam, 1-bit LAMB and 0/1 Adam at more than one rank:
 * "worker_error" (the compression error this rank feeds back into the
 * parameter's elements; 1-bit Adam has none for parameters of non_freeze
 * groups, and 1-bit Adam and 1-bit LAMB have it only from the compression
 * stage on); 1-bit LAMB: "exp_avg_sq_fresh" (the variance it keeps updating
 * while exp_avg_sq is frozen; unused before the compression stage).
 * Without ZeRO the view holds the whole parameter; under ZeRO stage 1 and 2
 * it holds the part of the parameter in this rank's shard (offset says
 * which; possibly none: data NULL, numel 0). A parameter that spans several
 * reduce buckets ("reduce_bucket_size" smaller than the model) can lie in
 * several separate runs of a rank's shard, which one view cannot show:
 * DSOPT_EINVAL then (the default bucket size never splits). The view stays
 * valid until dsopt_destroy and always shows the current state; only the
 * "worker_error" of 1-bit Adam and 1-bit LAMB lives until the next
 * dsopt_state_load or dsopt_state_load_shards, which rebuild the
 * compression buffers (get the view again after one). Writing through a
 * view is allowed between dsopt calls (not while gradients are being
 * handed over): the next step uses the new values, as if they had been
 * loaded from a blob; keep the ranks' replicated state identical. With
 * "device": "cuda" the view is device memory, except under ZeRO's CPU
 * offload (host memory).
 * Returns DSOPT_OK, DSOPT_EINVAL (NULL pointer, struct_size below 4,
 * index out of range, a name this optimizer does not have for this
 * parameter now, a parameter split by reduce buckets; the message lists the
 * names it has), DSOPT_ECOMM (the optimizer is marked failed, see
 * dsopt_step). Not collective. */
DSOPT_API int dsopt_get_state_view(dsopt_optimizer *opt, int64_t param_index, const char *name,
                                   dsopt_state_view *out);

/* The names dsopt_get_state_view accepts for this optimizer, separated by
 * single spaces ("master" included only when a parameter is 16-bit,
 * "worker_error" only where the optimizer compresses, at more than one rank).
 * *out_names is static or lives as long as the optimizer.
 * Returns DSOPT_OK or DSOPT_EINVAL. */
DSOPT_API int dsopt_state_names(const dsopt_optimizer *opt, const char **out_names);

/* The number of updates applied to parameter `param_index` (torch.optim's
 * state["step"]): the steps applied so far, less those in which its
 * gradient was absent on every rank (Adam/AdamW; see dsopt_step). Adam's
 * bias correction uses it. Part of the state blob.
 * Returns DSOPT_OK or DSOPT_EINVAL. Not collective. */
DSOPT_API int dsopt_get_param_step(const dsopt_optimizer *opt, int64_t param_index,
                                   int64_t *out_step);

/* Sets it (e.g. when moving a run's state from torch.optim over to dsopt
 * with dsopt_get_state_view). Adam/AdamW only; step >= 0. Not collective;
 * set the same value on every rank.
 * Returns DSOPT_OK, DSOPT_EINVAL (NULL handle, index out of range, step < 0)
 * or DSOPT_EUNSUPPORTED (the 1-bit optimizers, whose stages follow the
 * steps applied). */
DSOPT_API int dsopt_set_param_step(dsopt_optimizer *opt, int64_t param_index, int64_t step);

/* Loss scale the caller multiplies its loss by for the next backward pass
 * (1.0 when loss scaling is off). Returns DSOPT_OK or DSOPT_EINVAL. */
DSOPT_API int dsopt_get_loss_scale(const dsopt_optimizer *opt, double *out_scale);

/* Bytes of the buffers dsopt holds for this optimizer on this rank: state
 * (moments, fp32 masters, ZeRO shards), gradient and communication buffers,
 * in host memory and in device memory. The caller's parameters and
 * gradients are not counted. Either pointer may be NULL (not both).
 * Returns DSOPT_OK or DSOPT_EINVAL. Not collective. */
DSOPT_API int dsopt_memory_usage(const dsopt_optimizer *opt, uint64_t *host_bytes,
                                 uint64_t *device_bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DSOPT_H */
