/*
 * dsopt: communication- and memory-efficient optimizers behind a C ABI.
 * Reference: docs/reference/c-api.md.
 *
 * Ownership: the caller owns the model, its parameters, its gradients and
 * its communicators; dsopt owns optimizer state. Handles: one handle must
 * not be used by two threads at once; separate handles are independent.
 *
 * Errors: every call that can fail returns an int status (DSOPT_OK or a
 * negative DSOPT_E* code); dsopt_last_error() on the same thread has the
 * detail. A failed call changes nothing, except:
 *  - DSOPT_ENONFINITE from dsopt_step: the step was skipped exactly as one
 *    that returns DSOPT_OK (info written, consecutive skips counted, the
 *    loss scaler saw the overflow);
 *  - DSOPT_ECOMM: the communicator may be unusable afterwards (an MPI or
 *    custom one always is), and when the failed collective was inside an
 *    update the optimizer is marked failed (docs/robustness.md "A failed
 *    collective");
 *  - DSOPT_EBUFS: the size output says how many bytes are needed.
 *
 * Versioned structs (dsopt_step_info, dsopt_state_view, dsopt_comm_ops,
 * dsopt_algorithm_info, dsopt_codec_options):
 * the caller sets struct_size = sizeof(the struct) as its header declares
 * it, and dsopt reads or writes only the first min(struct_size, sizeof)
 * bytes. An input struct's fields past struct_size take their defaults;
 * an output struct's fields past it are not written; fields a newer caller
 * has past this header's struct are ignored. A struct_size below the
 * struct's smallest layout is DSOPT_EINVAL.
 *
 * Stability: everything above the "EXPERIMENTAL" section keeps its name,
 * signature and meaning (new calls, fields and codes may be added). The
 * experimental calls may change in a minor release; define
 * DSOPT_STABLE_ONLY before including this header to leave them out.
 *
 * Hyperparameters: each has one canonical way to read and set it
 * (docs/reference/c-api.md "One way per hyperparameter"); the other calls
 * that reach it are thin aliases.
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

/* ========================================================================
 * STABLE
 * ====================================================================== */

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
  DSOPT_EMISMATCH    = -6, /* blob of another algorithm/shape, or ranks disagree on config;
                              also what every other rank returns when one rank's part of
                              a collective call failed */
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
 * Versions (written here only: the build reads them from this header)
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

/* Where a buffer lives (dsopt_state_view.device, the custom collectives). */
enum { DSOPT_COMM_HOST = 0, DSOPT_COMM_CUDA = 1 };

/* A world of one rank; no communication. *out is owned by the caller and
 * released with dsopt_comm_destroy. Returns DSOPT_OK, DSOPT_EINVAL (out is
 * NULL) or DSOPT_ENOMEM. Not collective. */
DSOPT_API int dsopt_comm_create_local(dsopt_comm **out);

/* Wraps an MPI communicator given by its Fortran handle (MPI_Comm_c2f(c),
 * comm.py2f() in mpi4py), borrowed until dsopt_comm_destroy and every
 * optimizer on it are destroyed. dsopt works on its own duplicate, and an
 * MPI failure returns DSOPT_ECOMM instead of aborting (docs/reference/c-api.md
 * "MPI communicators"). Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_EUNSUPPORTED
 * (no MPI in this build, or its plugin cannot be loaded) or DSOPT_ENOMEM.
 * Not collective. */
DSOPT_API int dsopt_comm_create_mpi(dsopt_comm **out, int64_t mpi_comm_f);

/* Wraps an NCCL communicator and the CUDA stream all of dsopt's device work
 * and communication on it runs on (NULL: the legacy default stream). Both are
 * borrowed. NCCL is loaded (dlopen "libnccl.so.2") on the first call.
 * Returns DSOPT_OK, DSOPT_EINVAL (out or comm is NULL),
 * DSOPT_EUNSUPPORTED (built without CUDA/NCCL, or NCCL cannot be loaded),
 * DSOPT_ECOMM or DSOPT_ENOMEM. Not collective. */
DSOPT_API int dsopt_comm_create_nccl(dsopt_comm **out, struct ncclComm *comm,
                                     struct CUstream_st *stream);

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

/* What a step did (output; versioned: see the top comment). Fields added
 * after the first layout: phase, grads_replicated, diverging,
 * bytes_inter_node (docs/reference/c-api.md "Step info"). */
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
                                the run's first 3 steps only; 0 on the others and at one rank */
  int32_t  diverging;    /* 1 while the run's global gradient norm stays far above its own recent
                            history (a divergence whose values are all finite, so that no step
                            is skipped); 0 otherwise and with "divergence_check" off. Every
                            rank reports the same */
  uint64_t bytes_inter_node; /* the part of bytes_sent sent to ranks of other nodes, counted as
                                bytes_sent is (docs/guides/multi-node.md); the nodes are those of
                                "topology" (declared, or found from the communicator) */
} dsopt_step_info;

/* dsopt_step_info.phase */
#define DSOPT_PHASE_SKIPPED    0 /* the step was skipped: nothing applied */
#define DSOPT_PHASE_FULL       1 /* full-precision averaged gradients: Adam, 1-bit Adam's warmup,
                                    0/1 Adam's variance-update steps */
#define DSOPT_PHASE_COMPRESSED 2 /* 1-bit compressed communication: 1-bit Adam's compression stage,
                                    0/1 Adam's 1-bit gradient steps (before var_freeze_step) */
#define DSOPT_PHASE_LOCAL      3 /* 0/1 Adam local step: no communication of gradients or momenta */
#define DSOPT_PHASE_SYNC       4 /* 0/1 Adam local step followed by the 1-bit sync of the accumulator */

/* Creates an optimizer for `num_params` parameters from a JSON config
 * (docs/reference/config.md). The parameter buffers (each its own memory:
 * overlapping ones are DSOPT_EINVAL) and `comm` are borrowed until
 * dsopt_destroy, which releases *out. Collective: the ranks must pass the
 * same config and parameter shapes, dtypes and groups, else every rank fails
 * (DSOPT_EMISMATCH, or a rank's own local error).
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_EUNSUPPORTED, DSOPT_EMISMATCH,
 * DSOPT_ENOMEM, DSOPT_ECOMM, DSOPT_ECUDA. */
DSOPT_API int dsopt_create(dsopt_optimizer **out, const char *config_json, dsopt_comm *comm,
                           const dsopt_tensor *params, int64_t num_params);

/* Applies one step with this rank's local gradients (one per parameter, same
 * order and numel, any float dtype; read only during the call). `info` may
 * be NULL. Collective: bad arguments on one rank fail the step on every rank
 * (the others with DSOPT_EMISMATCH), changing nothing. A step with a non-finite gradient is skipped on every
 * rank; DSOPT_ENONFINITE when the run stops progressing. A failed collective
 * inside the update marks the optimizer failed. grads NULL with num_grads 0
 * completes a handed-over step (dsopt_grad_ready); num_grads < 0 abandons
 * the step. Absent gradients (data NULL), skipping, handshake and failure
 * points: docs/reference/c-api.md "dsopt_step".
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_EMISMATCH, DSOPT_ECOMM, DSOPT_ECUDA,
 * DSOPT_ENOMEM, DSOPT_ENONFINITE. */
DSOPT_API int dsopt_step(dsopt_optimizer *opt, const dsopt_tensor *grads, int64_t num_grads,
                         dsopt_step_info *info /* may be NULL */);

/* Points the optimizer at new storage for its parameters (the caller's
 * framework moved them): every parameter again, in order, with the numel,
 * dtype and group given to dsopt_create. Nothing else changes, so the run
 * continues bit-identically; the old buffers may be freed once this returns.
 * Not collective. Returns DSOPT_OK or DSOPT_EINVAL (a descriptor that does
 * not fit, overlapping storage, gradients being handed over; nothing
 * changes). */
DSOPT_API int dsopt_rebind_params(dsopt_optimizer *opt, const dsopt_tensor *params,
                                  int64_t num_params);

/* The learning rate of every parameter group: an alias of
 * dsopt_set_group_param(opt, g, "lr", lr) for each group g.
 * Returns DSOPT_OK or DSOPT_EINVAL (NULL handle, lr negative or not finite).
 * Not collective; call it with the same value on every rank. */
DSOPT_API int dsopt_set_lr(dsopt_optimizer *opt, double lr);

/* "gradient_clipping" (the global gradient norm's limit; 0: off) from the
 * next step on, for frameworks that own the clipping setting. Returns
 * DSOPT_OK or DSOPT_EINVAL (NULL handle, negative or not finite, or
 * gradients handed over for the step in progress). Not collective; the same
 * value on every rank between the same steps. */
DSOPT_API int dsopt_set_gradient_clipping(dsopt_optimizer *opt, double max_norm);
DSOPT_API int dsopt_get_gradient_clipping(const dsopt_optimizer *opt, double *out_max_norm);

/* The CPU threads of the optimizer's host work: the config's "threads", else
 * this process's share of its allowed cores among the ranks on the same
 * machine (OMP_NUM_THREADS, when set, instead; capped by the affinity mask),
 * at least 1. Returns DSOPT_OK or DSOPT_EINVAL. Not collective. */
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

/* Restores a blob of dsopt_state_save into an optimizer of the same config
 * and parameter shapes, validating all of it first; master weights are
 * written back into 16-bit parameters. Another world size: rank-local state
 * resets; another rank's rank-local state is DSOPT_EMISMATCH
 * (docs/reference/c-api.md "Loading state"). Collective: when any rank
 * fails, every rank fails and nothing changes.
 * Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_ECORRUPT, DSOPT_EMISMATCH,
 * DSOPT_ECUDA, DSOPT_ECOMM (also when the optimizer is marked failed). */
DSOPT_API int dsopt_state_load(dsopt_optimizer *opt, const void *src, uint64_t size);

/* dsopt_state_load_ex flags: load a blob that holds another rank's
 * rank-local state by resetting that state on every rank (the 1-bit
 * optimizers; a ZeRO shard is still DSOPT_EMISMATCH). */
#define DSOPT_LOAD_RESET_RANK_LOCAL 1u
/* dsopt_state_load_ex flags: the blob carries no rank-local state (its
 * rank-local sections may be empty: a caller that keeps that state
 * elsewhere, or has none for this optimizer's layout, as under FSDP at
 * another topology); the rest is loaded and the rank-local state reset on
 * every rank, as DSOPT_LOAD_RESET_RANK_LOCAL resets it. */
#define DSOPT_LOAD_WITHOUT_RANK_LOCAL 2u

/* dsopt_state_load with `flags` (0, DSOPT_LOAD_RESET_RANK_LOCAL and/or
 * DSOPT_LOAD_WITHOUT_RANK_LOCAL; 0 is dsopt_state_load). *out_reset (may be NULL) is set to 1 when rank-local
 * state was reset (the flag's reset, or the 1-bit optimizers' compression
 * errors of another world size or topology), else 0; on every rank alike.
 * Collective.
 * Returns what dsopt_state_load returns; DSOPT_EINVAL also for unknown
 * flags. */
DSOPT_API int dsopt_state_load_ex(dsopt_optimizer *opt, const void *src, uint64_t size,
                                  uint32_t flags, int32_t *out_reset);

/* Restores a run saved at any world size from all of its ranks' blobs
 * (blobs[i], sizes[i] bytes, from old rank i; every rank passes all of
 * them), validated together first. Adam/AdamW and LAMB reshard their ZeRO
 * state; the others load replicated state (docs/reference/c-api.md "Loading state").
 * Collective. Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_ECORRUPT,
 * DSOPT_EMISMATCH (a blob missing, duplicated, misordered or of another
 * run), DSOPT_ECUDA. */
DSOPT_API int dsopt_state_load_shards(dsopt_optimizer *opt, const void *const *blobs,
                                      const uint64_t *sizes, int64_t num_blobs);

/* Releases the optimizer and its state; the borrowed parameters and the
 * communicator are left alone. NULL is fine. Collective. */
DSOPT_API void dsopt_destroy(dsopt_optimizer *opt);

/* The momentum mask of parameter `param_index` for the 1-bit optimizers
 * (DeepSpeed's exp_avg_mask), multiplied into the momentum after every
 * compressed step: numel of the parameter, DSOPT_FLOAT32, on the optimizer's
 * device; copied. NULL clears it. Not part of the state blob. Not
 * collective; the same masks on every rank. Returns DSOPT_OK, DSOPT_EINVAL
 * (a mask that does not fit, a non_freeze group) or DSOPT_EUNSUPPORTED (no
 * momentum mask, e.g. Adam). */
DSOPT_API int dsopt_set_momentum_mask(dsopt_optimizer *opt, int64_t param_index,
                                      const dsopt_tensor *mask);

/* Number of parameter groups (1 when the config has no "param_groups").
 * Returns DSOPT_OK or DSOPT_EINVAL. */
DSOPT_API int dsopt_num_groups(const dsopt_optimizer *opt, int32_t *out_count);

/* Learning rate of one group: an alias of dsopt_get_group_param(opt, group,
 * "lr", out_lr). Returns DSOPT_OK or DSOPT_EINVAL (NULL pointer, group out
 * of range). */
DSOPT_API int dsopt_get_lr(const dsopt_optimizer *opt, int32_t group, double *out_lr);

/* Sets the learning rate of one group: an alias of dsopt_set_group_param(opt,
 * group, "lr", lr). Returns DSOPT_OK or DSOPT_EINVAL. Not collective; same
 * value on every rank. */
DSOPT_API int dsopt_set_group_lr(dsopt_optimizer *opt, int32_t group, double lr);

/* The canonical way to read or set a group's hyperparameter at run time, by
 * name: the algorithm's (dsopt_group_param_names), e.g. "lr", "beta1",
 * "beta2", "eps", "weight_decay" for Adam. A value set applies from the
 * next step on and is part of the state blob; lr, eps and weight_decay
 * finite and >= 0, betas in [0, 1) and below 1 in fp32. Not collective;
 * the same values on every rank. Returns DSOPT_OK or DSOPT_EINVAL (NULL
 * pointer, group out of range, a name the algorithm does not have (Lion:
 * "eps"), invalid value; nothing changes). */
DSOPT_API int dsopt_get_group_param(const dsopt_optimizer *opt, int32_t group, const char *name,
                                    double *out_value);
DSOPT_API int dsopt_set_group_param(dsopt_optimizer *opt, int32_t group, const char *name,
                                    double value);


/* Loss scale the caller multiplies its loss by for the next backward pass
 * (1.0 when loss scaling is off). Returns DSOPT_OK or DSOPT_EINVAL. */
DSOPT_API int dsopt_get_loss_scale(const dsopt_optimizer *opt, double *out_scale);

/* Bytes of the buffers dsopt holds for this optimizer on this rank (state,
 * gradient and communication buffers; not the caller's parameters and
 * gradients), in host and in device memory. Either pointer may be NULL (not
 * both). Returns DSOPT_OK or DSOPT_EINVAL. Not collective. */
DSOPT_API int dsopt_memory_usage(const dsopt_optimizer *opt, uint64_t *host_bytes,
                                 uint64_t *device_bytes);

/* The number of updates applied to parameter `param_index` (torch.optim's
 * state["step"]): the steps applied, less those in which its gradient was
 * absent on every rank (Adam/AdamW). Part of the state blob.
 * Returns DSOPT_OK or DSOPT_EINVAL. Not collective. */
DSOPT_API int dsopt_get_param_step(const dsopt_optimizer *opt, int64_t param_index,
                                   int64_t *out_step);

/* Sets it (moving a run's state over from torch.optim). Adam/AdamW only;
 * step >= 0. Not collective; the same value on every rank. Returns
 * DSOPT_OK, DSOPT_EINVAL or DSOPT_EUNSUPPORTED (every other type). */
DSOPT_API int dsopt_set_param_step(dsopt_optimizer *opt, int64_t param_index, int64_t step);

/* ========================================================================
 * EXPERIMENTAL: the newest calls, which may still change in a minor
 * release (docs/reference/c-api.md "Stability"). Left out when
 * DSOPT_STABLE_ONLY is defined.
 * ====================================================================== */
#ifndef DSOPT_STABLE_ONLY

/* ------------------------------------------------------------------------
 * Custom communicators: the caller's own collectives (torch.distributed,
 * MPI.jl, HCCL, a custom runtime) behind a table of callbacks
 * ---------------------------------------------------------------------- */

/* Element types and reductions the callbacks receive. */
enum {
  DSOPT_COMM_FLOAT32 = 0,
  DSOPT_COMM_FLOAT64 = 1,
  DSOPT_COMM_INT32   = 2,
  DSOPT_COMM_INT64   = 3,
  DSOPT_COMM_UINT8   = 4
};
enum { DSOPT_COMM_SUM = 0, DSOPT_COMM_MAX = 1 };

/* dsopt_comm_ops.flags: the callbacks may be called from a thread dsopt
 * starts while the caller's own threads use dsopt and the runtime (needed
 * for dsopt_grad_ready to overlap reductions with the backward pass). */
#define DSOPT_COMM_CONCURRENT 1u

/* The collectives dsopt needs, as functions of the caller (input; versioned:
 * see the top comment). Every rank calls each in the same order with the
 * same count, elem, op and device (DSOPT_COMM_HOST or DSOPT_COMM_CUDA).
 * Each returns 0, or nonzero for a failure (DSOPT_ECOMM; the communicator
 * is not called again), and must return rather than wait forever for a
 * failed rank. Buffers, streams and the sums over ranks:
 * docs/reference/c-api.md "Custom communicators".
 * Required: allreduce, reduce_scatter, allgather, alltoall (the smallest
 * layout ends with alltoall). Optional (NULL, also past struct_size):
 * error_message, release. */
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
 * Returns DSOPT_OK, DSOPT_EINVAL (out or ops NULL, struct_size below the
 * smallest layout, a required callback missing, rank or size out of range,
 * unknown flags) or DSOPT_ENOMEM. Not collective. An optimizer with
 * "device": "cuda" runs its device work on ops->stream. */
DSOPT_API int dsopt_comm_create_custom(dsopt_comm **out, const dsopt_comm_ops *ops, void *user);

/* Gives dsopt the node and rail communicators of `comm` (any backend; for
 * custom communicators, which dsopt cannot split, the only way to run the
 * node-aware compressed collectives): `node` holds the ranks of this rank's
 * node ranked by local index (R ranks), `rail` the ranks of this rank's
 * local index, one per node, ranked by node (N ranks), N * R the size of
 * `comm`. Optimizers created on `comm` afterwards take their topology
 * from them (this rank is node rail-rank, local index node-rank) and, where
 * "topology" "hierarchy" makes them node-aware, run on them instead of
 * splitting `comm`; their bytes count in `comm`'s step report (bytes_sent,
 * bytes_inter_node). Both are borrowed: they must outlive `comm` and every
 * optimizer created on it; each may belong to one communicator. Both NULL:
 * forget them (for optimizers created afterwards). Not collective; the
 * layout is checked collectively by dsopt_create (DSOPT_EINVAL on every
 * rank when the communicators do not fit together, or a config's
 * "ranks_per_node" differs from R). Returns DSOPT_OK, DSOPT_EINVAL (comm
 * NULL, one of node and rail NULL, node or rail the same as comm or as each
 * other, or N * R not the size of comm). docs/reference/c-api.md
 * "Node and rail communicators". */
DSOPT_API int dsopt_comm_set_nodes(dsopt_comm *comm, dsopt_comm *node, dsopt_comm *rail);

/* Declares that the parameters of optimizers created on `comm` afterwards
 * are this rank's shards of tensors that the ranks of `shards` hold
 * together, as PyTorch's FSDP shards a model: each rank of `shards` holds
 * one part of every tensor (possibly none of it), and the ranks of `comm`
 * hold the same parts (replicas; `comm` may be a world of one). Such an
 * optimizer averages gradients over `comm` only (they arrive reduced over
 * `shards` already) and reduces over `shards` what whole tensors decide: the
 * non-finite check (a step is skipped on every rank of both), the global
 * gradient norm (gradient_clipping, grad_norm) and LAMB's and 1-bit LAMB's
 * per-tensor norms (one allreduce of every tensor's partial sums where the
 * update needs them). A parameter may then have numel 0 (this rank holds
 * none of it; data may be NULL) and its gradient numel 0 (data NULL: absent,
 * as always). dsopt_create is then collective over `comm` and `shards`
 * together and checks that the ranks of `shards` agree on the config and the
 * number of parameters (their numel may differ); dsopt_step is collective
 * over both; state blobs hold this rank's shards. ZeRO stage 1/2 is not
 * supported on such a communicator (DSOPT_EUNSUPPORTED from dsopt_create).
 * `shards` of one rank changes nothing. `shards` is borrowed: it must
 * outlive `comm` and every optimizer created on it; it counts its bytes in
 * `comm`'s step report, and may belong to one communicator. NULL: forget it
 * (for optimizers created afterwards). Not collective. Returns DSOPT_OK or
 * DSOPT_EINVAL (comm NULL, shards the same as comm). docs/reference/c-api.md
 * "Sharded parameters". */
DSOPT_API int dsopt_comm_set_shards(dsopt_comm *comm, dsopt_comm *shards);

/* ------------------------------------------------------------------------
 * Overlapping the gradient reduction with backward
 * ---------------------------------------------------------------------- */

/* Hands over parameter `param_index`'s local gradient of one micro-batch
 * while backward still runs, so that its reduction overlaps the rest;
 * dsopt_step(opt, NULL, 0, info) then completes the step, bit-identical to
 * passing the gradients to dsopt_step. `grad` is read before the call
 * returns. Any order; "gradient_accumulation_steps" hand-overs per parameter
 * and step. Buffers, micro-batches, order and threads:
 * docs/reference/c-api.md "dsopt_grad_ready". Collective only through
 * dsopt_step. Returns DSOPT_OK, DSOPT_EINVAL (nothing changes), DSOPT_ECOMM,
 * DSOPT_ECUDA, DSOPT_ENOMEM. */
DSOPT_API int dsopt_grad_ready(dsopt_optimizer *opt, int64_t param_index, const dsopt_tensor *grad);

/* ------------------------------------------------------------------------
 * Live state
 * ---------------------------------------------------------------------- */

/* Where dsopt keeps part of one parameter's optimizer state (output;
 * versioned: see the top comment). */
typedef struct dsopt_state_view {
  uint32_t     struct_size; /* caller sets sizeof(dsopt_state_view) */
  int32_t      device;      /* DSOPT_COMM_HOST or DSOPT_COMM_CUDA: where tensor.data lives */
  dsopt_tensor tensor;      /* fp32 elements in dsopt's own buffer (tensor.group: the parameter's
                               group); data NULL and numel 0 when this rank holds none of them */
  int64_t      offset;      /* index within the parameter of the first element tensor.data holds */
  int64_t      param_numel; /* the parameter's numel */
} dsopt_state_view;

/* The state tensor `name` ("exp_avg", "exp_avg_sq", "master", ...:
 * dsopt_state_names) of parameter `param_index`, as a view of dsopt's own
 * memory (no copy): the whole parameter, or under ZeRO this rank's part.
 * The view always shows the current state and may be written between dsopt
 * calls; lifetime, names and ZeRO: docs/reference/c-api.md "State views".
 * Not collective. Returns DSOPT_OK, DSOPT_EINVAL (the message lists the
 * names this parameter has), DSOPT_ECOMM (the optimizer is marked failed). */
DSOPT_API int dsopt_get_state_view(dsopt_optimizer *opt, int64_t param_index, const char *name,
                                   dsopt_state_view *out);

/* The names dsopt_get_state_view accepts for this optimizer, separated by
 * single spaces ("master" included only when a parameter is 16-bit,
 * "worker_error" only where the optimizer compresses, at more than one rank).
 * *out_names is static or lives as long as the optimizer.
 * Returns DSOPT_OK or DSOPT_EINVAL. */
DSOPT_API int dsopt_state_names(const dsopt_optimizer *opt, const char **out_names);

/* ------------------------------------------------------------------------
 * The canonical configuration
 * ---------------------------------------------------------------------- */

/* The optimizer's configuration as canonical JSON text: every key of
 * docs/reference/config.md with its effective value (defaults filled in,
 * aliases resolved), the group hyperparameters and gradient clipping as
 * they are now. Creating an optimizer from it gives the same text. Writes
 * the text and its NUL into dst (`capacity` bytes); *out_size (may be NULL)
 * receives the bytes needed. dst NULL with capacity 0 asks for the size
 * only. Not collective. Returns DSOPT_OK, DSOPT_EINVAL, DSOPT_EBUFS
 * (nothing written). */
DSOPT_API int dsopt_get_config(const dsopt_optimizer *opt, char *dst, uint64_t capacity,
                               uint64_t *out_size);

/* The group hyperparameters of the algorithm `optimizer_type` (a config's
 * "optimizer.type", any case or alias): the names dsopt_get/set_group_param
 * accept, separated by single spaces ("lr beta1 beta2 eps weight_decay";
 * Lion: "lr beta1 beta2 weight_decay"), and in *out_keys the config key of
 * each, in the same order ("lr betas betas eps weight_decay"): a key named
 * more than once is a list of those hyperparameters' values, in that order,
 * in optimizer.params and param_groups[i]. Either out pointer may be NULL,
 * not both. The strings are static. Returns DSOPT_OK or DSOPT_EINVAL (NULL
 * pointers, unknown type). */
DSOPT_API int dsopt_group_param_names(const char *optimizer_type, const char **out_names,
                                      const char **out_keys);

/* ------------------------------------------------------------------------
 * What an algorithm is
 * ---------------------------------------------------------------------- */

/* The algorithms this library has: their "optimizer.type" names,
 * separated by single spaces ("Lamb Lion Adam AdamW SGD OneBitAdam ...").
 * The string is static. Returns DSOPT_OK or DSOPT_EINVAL (out_names NULL). */
DSOPT_API int dsopt_algorithm_names(const char **out_names);

/* dsopt_algorithm_info.flags */
enum {
  /* Parameters count their own steps (dsopt_get/set_param_step, as
   * torch.optim's state["step"]); a gradient absent on every rank leaves
   * its parameter alone; each parameter's state stands on its own, so an
   * optimizer rebuilt with more parameters (a parameter group added after
   * the first step) can take it over. */
  DSOPT_ALGORITHM_PARAM_STEPS = 1 << 0,
  /* Runs under ZeRO stage 1/2, compressed ZeRO included. */
  DSOPT_ALGORITHM_ZERO = 1 << 1,
  /* Its ZeRO shard can live in host memory on a CUDA optimizer
   * ("offload_optimizer"). */
  DSOPT_ALGORITHM_OFFLOAD = 1 << 2,
  /* 1-bit compressed communication after a warmup (error feedback, stages,
   * momentum masks: dsopt_set_momentum_mask). */
  DSOPT_ALGORITHM_COMPRESSED = 1 << 3
};

/* dsopt_algorithm_info.hyper_ranges */
enum {
  DSOPT_HYPER_BETA = 0,         /* in [0, 1), and below 1 in fp32 */
  DSOPT_HYPER_NONNEGATIVE = 1,  /* finite and >= 0 */
  DSOPT_HYPER_FLAG = 2          /* 0 or 1; true or false in a config */
};

/* What an algorithm is (dsopt_algorithm_describe). Every pointer is static
 * and never NULL; lists are separated by single spaces ("" when empty).
 * Versioned by struct_size (the header's rule): fields past the caller's
 * struct_size are not written. */
typedef struct dsopt_algorithm_info {
  uint32_t struct_size;     /* caller sets sizeof(dsopt_algorithm_info) */
  uint32_t flags;           /* DSOPT_ALGORITHM_* */
  const char *type;         /* its canonical "optimizer.type" */
  const char *aliases;      /* other accepted spellings (any case, as the type) */
  int32_t moments;          /* fp32 moments per element its state keeps (m: 1; m and v: 2) */
  int32_t num_hyper;        /* group hyperparameters, lr first */
  const char *moment_names; /* their dsopt_get_state_view names ("exp_avg exp_avg_sq") */
  const char *hyper_names;  /* as dsopt_group_param_names: "lr beta1 beta2 eps weight_decay" */
  const char *hyper_keys;   /* the config key of each, in the same order ("lr betas betas ...") */
  const double *hyper_defaults;  /* num_hyper defaults of optimizer.params */
  const int32_t *hyper_ranges;   /* num_hyper DSOPT_HYPER_* */
  const char *keys;         /* optimizer.params keys beyond the hyperparameters */
  const char *group_keys;   /* param_groups[i] keys beyond the hyperparameters */
} dsopt_algorithm_info;

/* Describes the algorithm `optimizer_type` (any case or alias) into *out,
 * up to out->struct_size. Not collective. Returns DSOPT_OK or DSOPT_EINVAL
 * (NULL pointers, a struct_size below the first layout, unknown type; *out
 * unchanged). */
DSOPT_API int dsopt_algorithm_describe(const char *optimizer_type, dsopt_algorithm_info *out);

/* The canonical JSON of a config text, without an optimizer (what
 * dsopt_get_config of an optimizer created from it returns before any
 * change). Same buffer convention. Returns DSOPT_OK, DSOPT_EINVAL (a bad
 * config, as dsopt_create says), DSOPT_EUNSUPPORTED, DSOPT_EBUFS. */
DSOPT_API int dsopt_config_canonical(const char *config_json, char *dst, uint64_t capacity,
                                     uint64_t *out_size);

/* ----------------------------------------------------------------------
 * Memory of the state
 * ---------------------------------------------------------------------- */

/* The part of dsopt_memory_usage that is state the blob saves on this rank
 * (moments, fp32 masters, compression errors, each algorithm's own arrays),
 * in host and in device memory; the rest of dsopt_memory_usage are
 * gradient, scratch and communication buffers. Either pointer may be NULL
 * (not both). Not collective. Returns DSOPT_OK or DSOPT_EINVAL. */
DSOPT_API int dsopt_state_memory_usage(const dsopt_optimizer *opt, uint64_t *host_bytes,
                                       uint64_t *device_bytes);

/* ------------------------------------------------------------------------
 * The deferred parameter allgather (ZeRO stage 1/2)
 * ---------------------------------------------------------------------- */

/* With "zero_optimization": {"deferred_allgather": true} at 2 or more
 * ranks, dsopt_step returns once the update of this rank's shard is done
 * and the allgather of the parameters is started on dsopt's thread, bucket
 * by bucket ("allgather_bucket_size" elements each, in parameter order or
 * in the order dsopt_gather_order gave), so that it overlaps the caller's
 * next forward. Parameter i is whole once its bucket
 * (dsopt_gather_bucket_of) has arrived; the caller waits for it with
 * dsopt_gather_wait or dsopt_gather_wait_bucket before reading it. Every
 * other call on the optimizer waits for all buckets first, so that nothing
 * else reads or changes half-gathered parameters. Where the communicator
 * cannot be called from dsopt's thread (NCCL, MPI below
 * MPI_THREAD_MULTIPLE, a custom one without DSOPT_COMM_CONCURRENT) the
 * gather finishes inside dsopt_step and the waits return at once. The
 * values are bit-identical either way. A gather that fails makes the wait
 * that meets it (or the next call) return its status, DSOPT_ECOMM for a
 * failed collective, and marks the optimizer failed as a failed update
 * does. Buffers, threads and memory: docs/reference/c-api.md "Deferred
 * parameter allgather". None of these calls is collective but
 * dsopt_gather_order. */

/* The number of buckets of the parameter allgather (0 where parameters are
 * never gathered: stage 0, one rank, another algorithm). Returns DSOPT_OK
 * or DSOPT_EINVAL. */
DSOPT_API int dsopt_gather_num_buckets(const dsopt_optimizer *opt, int64_t *out_count);

/* The bucket after whose arrival parameter `param_index` is whole (buckets
 * arrive in order, numbered by their position in the gather order): -1
 * when it is never gathered. Returns DSOPT_OK or DSOPT_EINVAL (index out of
 * range). */
DSOPT_API int dsopt_gather_bucket_of(const dsopt_optimizer *opt, int64_t param_index,
                                     int64_t *out_bucket);

/* The buckets of the last step's allgather that have not arrived yet (0
 * when none is in flight). Does not wait. Returns DSOPT_OK or
 * DSOPT_EINVAL. */
DSOPT_API int dsopt_gather_pending(dsopt_optimizer *opt, int64_t *out_pending);

/* Waits until buckets 0 .. `bucket` have arrived (-1: every bucket); at once
 * when nothing is in flight. Returns DSOPT_OK, DSOPT_EINVAL (bucket out of
 * range), or the failed gather's status (DSOPT_ECOMM, DSOPT_ECUDA; the
 * optimizer is then marked failed). */
DSOPT_API int dsopt_gather_wait_bucket(dsopt_optimizer *opt, int64_t bucket);

/* Waits until parameter `param_index` is whole (-1: every parameter).
 * Returns what dsopt_gather_wait_bucket returns. */
DSOPT_API int dsopt_gather_wait(dsopt_optimizer *opt, int64_t param_index);

/* Collective. The order in which the caller needs the parameters (a
 * model's forward order): `param_order` lists every parameter index once
 * (count == the number of parameters; NULL with count 0: the default,
 * parameter order). From the next step on, the buckets are posted in the
 * order in which these parameters first need them (a bucket holds parts of
 * several parameters; buckets no parameter of the order needs go last), and
 * buckets are numbered by that position: dsopt_gather_bucket_of,
 * dsopt_gather_wait_bucket and dsopt_gather_pending count in gather order,
 * and a parameter spread over several buckets is whole after the last of
 * them in that order. The default order and the identity permutation post
 * the buckets in bucket order, as without this call. Values, step infos and
 * state blobs are bit-identical whatever the order; the order is not part
 * of the state (a blob does not carry it). Where the gather cannot be
 * deferred (a communicator that cannot be called from dsopt's thread) it
 * runs inside dsopt_step and only the numbering follows the order; where
 * nothing is gathered (stage 0, one rank, another algorithm) the order is
 * checked and has no effect. Waits for the gathers in flight first. Every
 * rank must pass the same order: returns DSOPT_OK; DSOPT_EINVAL on a rank
 * whose order is not a permutation of the parameter indices
 * (DSOPT_EMISMATCH on the other ranks), or while a step's gradients are
 * being handed over; DSOPT_EMISMATCH on every rank when the ranks passed
 * different orders. On any error nothing changes on any rank. */
DSOPT_API int dsopt_gather_order(dsopt_optimizer *opt, const int64_t *param_order, int64_t count);

/* ------------------------------------------------------------------------
 * Codecs: compressed ZeRO's codes for the caller's own collectives
 * ---------------------------------------------------------------------- */

/* The block codes of compressed ZeRO (docs/guides/compressed-zero.md
 * "Codecs"), bit for bit, for a caller that moves the bytes itself (the
 * FSDP2 collectives of dsopt.torch.fsdp, say): "int8", "int4" and "sign"
 * (an fp32 scale per block of `block` elements, then 8, 4 or 1 bit per
 * element; with an error-feedback residual), and "bf16" (2 bytes per
 * element, no blocks, no residual). A run of n values is encoded on its
 * own: its blocks start at its first element. Layouts, residual and
 * examples: docs/reference/c-api.md "Codecs". None of these calls is
 * collective. */
typedef struct dsopt_codec dsopt_codec;

/* How a codec is made (input; versioned: see the top comment). */
typedef struct dsopt_codec_options {
  uint32_t struct_size;       /* caller sets sizeof(dsopt_codec_options) */
  int32_t  device;            /* DSOPT_COMM_HOST (default) or DSOPT_COMM_CUDA: where every buffer
                                 given to the codec lives */
  int64_t  block;             /* elements per scaled block: a multiple of 8 in [8, 65536], or 0
                                 (default): 64, compressed ZeRO's gradient blocks; 0 for "bf16" */
  int32_t  threads;           /* host: CPU threads of the kernels (0, default: OpenMP's count);
                                 the bytes do not depend on it */
  int32_t  reserved;          /* 0 */
  struct CUstream_st *stream; /* CUDA: the stream the work is queued on (NULL, default: the
                                 legacy default stream); unused on host */
} dsopt_codec_options;

/* A codec `name` ("int8", "int4", "sign" or "bf16") as *options says
 * (NULL: every default). Free it with dsopt_codec_destroy. Returns
 * DSOPT_OK, DSOPT_EINVAL (out or name NULL, an unknown name, a bad block,
 * device or thread count, reserved not 0, struct_size below the first
 * layout), DSOPT_EUNSUPPORTED (DSOPT_COMM_CUDA in a build without CUDA or
 * without a device), DSOPT_ENOMEM. */
DSOPT_API int dsopt_codec_create(dsopt_codec **out, const char *name,
                                 const dsopt_codec_options *options);

/* Bytes of the code of one run of n > 0 values: ceil(n / block) records of
 * 4 + block * bits / 8 bytes; "bf16": 2 n. Returns DSOPT_OK or
 * DSOPT_EINVAL. */
DSOPT_API int dsopt_codec_encoded_size(const dsopt_codec *codec, int64_t n, uint64_t *out_bytes);

/* Bytes of the error-feedback residual of one run of n > 0 values: an int8
 * code of the same blocks, ceil(n / block) (4 + block) bytes; all zero
 * bytes are the zero residual. Returns DSOPT_OK, DSOPT_EINVAL,
 * DSOPT_EUNSUPPORTED ("bf16" keeps no residual). */
DSOPT_API int dsopt_codec_residual_size(const dsopt_codec *codec, int64_t n, uint64_t *out_bytes);

/* Encodes `runs` runs of n = values->numel / runs fp32 values each (run j:
 * elements j n .. (j+1) n - 1) into dst, run j's code at
 * j * dsopt_codec_encoded_size(n). With a residual (NULL: none), run j's
 * values are encoded as x = fl(g + e), e its residual run (at
 * j * dsopt_codec_residual_size(n)), and the residual becomes the int8 code
 * of fl(x - x'), in place. values, residual and dst are borrowed for the
 * call (on a CUDA codec: until the work queued on its stream is done) and
 * must not overlap. Returns DSOPT_OK, DSOPT_EINVAL (NULL pointers, numel
 * <= 0 or not a multiple of runs, runs < 1, a dtype other than
 * DSOPT_FLOAT32, residual_size not runs residual runs, buffers that overlap
 * or live on another device than the codec's), DSOPT_EUNSUPPORTED (a
 * residual for "bf16"), DSOPT_EBUFS (capacity below runs encoded runs;
 * nothing written). Nothing is written on any error. */
DSOPT_API int dsopt_codec_encode(dsopt_codec *codec, const dsopt_tensor *values, int64_t runs,
                                 void *residual, uint64_t residual_size, void *dst,
                                 uint64_t capacity);

/* out[i] = the sum over runs j = 0, 1, ..., runs - 1, in that order (one
 * fp32 rounding per addition), of element i of run j decoded, for the
 * `runs` codes of n = out->numel values each that `codes` holds back to
 * back (`size` bytes, at least runs encoded runs). runs == 1 decodes one
 * run. codes and out are borrowed for the call (CUDA: as for encode) and
 * must not overlap. Returns DSOPT_OK or DSOPT_EINVAL (NULL pointers, numel
 * <= 0, runs < 1, a dtype other than DSOPT_FLOAT32, size too small,
 * overlap, another device; nothing written). */
DSOPT_API int dsopt_codec_decode_sum(dsopt_codec *codec, const void *codes, uint64_t size,
                                     int64_t runs, const dsopt_tensor *out);

/* The CUDA stream the codec's later work is queued on (NULL: the legacy
 * default stream); the work queued on the previous one is waited for
 * first. Call it with the codec's device current. Unused on a host codec.
 * Returns DSOPT_OK, DSOPT_EINVAL (codec NULL, another device current),
 * DSOPT_ECUDA. */
DSOPT_API int dsopt_codec_set_stream(dsopt_codec *codec, struct CUstream_st *stream);

/* Frees a codec (NULL is fine); on CUDA, after its queued work is done. */
DSOPT_API void dsopt_codec_destroy(dsopt_codec *codec);

#endif /* DSOPT_STABLE_ONLY */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DSOPT_H */
