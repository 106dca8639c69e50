/* A custom communicator whose callbacks run MPI themselves steps every
 * optimizer exactly as dsopt_comm_create_mpi does: parameters, state blobs,
 * info.phase and info.bytes_sent bit-identical at every step (AdamW, fp16
 * with clipping, ZeRO 1 and 2, 1-bit Adam through its compressed stage,
 * 1-bit LAMB, 0/1 Adam). A callback failing on one rank makes every rank's
 * step return DSOPT_ECOMM, none hanging, with the callback's text, and the
 * communicator is not called again. Bad tables are rejected. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/mpi_world.h"

/* ---- the callbacks: MPI on a duplicate of MPI_COMM_WORLD ---------------- */

typedef struct mpi_ops {
  MPI_Comm comm;
  long calls;
  long fail_at;      /* the call (1, 2, ...) at which fail_rank injects a failure; 0: never */
  int fail_rank;
  char message[128];
  int released;
} mpi_ops;

/* Before each collective the ranks agree whether one of them failed (as a
 * runtime that propagates failures does, e.g. NCCL's abort or gloo's closed
 * connections): the failing rank and its peers all return an error. */
static int failed_somewhere(mpi_ops *o) {
  ++o->calls;
  int mine = o->fail_at > 0 && o->calls == o->fail_at && world_rank() == o->fail_rank;
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, o->comm);
  if (!any) return 0;
  if (mine)
    snprintf(o->message, sizeof o->message, "injected failure at call %ld", o->calls);
  else
    snprintf(o->message, sizeof o->message, "rank %d failed", o->fail_rank);
  return 1;
}

static int mpi_status(int rc, mpi_ops *o) {
  if (rc == MPI_SUCCESS) return 0;
  snprintf(o->message, sizeof o->message, "MPI error %d", rc);
  return 2;
}

static int op_allreduce(const void *send, void *recv, size_t count, int32_t elem, int32_t op, int32_t device,
                        void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type_of(elem),
                                  op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM, o->comm),
                    o);
}
static int op_reduce_scatter(const void *send, void *recv, size_t count, int32_t elem, int32_t op,
                             int32_t device, void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Reduce_scatter_block(send, recv, (int)count, mpi_type_of(elem),
                                             op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM, o->comm),
                    o);
}
static int op_allgather(const void *send, void *recv, size_t count, int32_t elem, int32_t device, void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Allgather(send, (int)count, mpi_type_of(elem), recv, (int)count, mpi_type_of(elem), o->comm), o);
}
static int op_alltoall(const void *send, void *recv, size_t count, int32_t elem, int32_t device, void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Alltoall(send, (int)count, mpi_type_of(elem), recv, (int)count, mpi_type_of(elem), o->comm), o);
}
static const char *op_error_message(int code, void *user) {
  (void)code;
  return ((mpi_ops *)user)->message;
}
static void op_release(void *user) { ((mpi_ops *)user)->released = 1; }

static dsopt_comm_ops table(void) {
  dsopt_comm_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  ops.rank = world_rank();
  ops.size = world_size();
  ops.allreduce = op_allreduce;
  ops.reduce_scatter = op_reduce_scatter;
  ops.allgather = op_allgather;
  ops.alltoall = op_alltoall;
  ops.error_message = op_error_message;
  ops.release = op_release;
  return ops;
}

static dsopt_comm *custom_comm(mpi_ops *o) {
  memset(o, 0, sizeof *o);
  MPI_Comm_dup(MPI_COMM_WORLD, &o->comm);
  dsopt_comm_ops ops = table();
  dsopt_comm *c = NULL;
  CHECK_OK(dsopt_comm_create_custom(&c, &ops, o));
  return c;
}

/* ---- bit-identity against dsopt_comm_create_mpi ------------------------- */

#define STEPS 8
#define NUM_TENSORS 4

static const tensor_spec specs[NUM_TENSORS] = {
    {1001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {257, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {64, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {3, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
};
static const tensor_spec half_specs[NUM_TENSORS] = {
    {1001, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {257, DSOPT_FLOAT32, DSOPT_FLOAT16, 1},
    {64, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0},
    {3, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
};

typedef struct case_t {
  const char *name;
  const char *config;
  const tensor_spec *specs;
} case_t;

#define GROUPS " \"param_groups\": [{}, {\"lr\": 0.004, \"weight_decay\": 0.02}], \"threads\": 1"
static const case_t cases[] = {
    {"AdamW", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}," GROUPS "}",
     specs},
    {"AdamW fp16 + clipping",
     "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS
     ", \"gradient_clipping\": 0.5, \"fp16\": {\"enabled\": true, \"initial_scale_power\": 6}}",
     half_specs},
    {"AdamW ZeRO-1", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS
                     ", \"zero_optimization\": {\"stage\": 1}}",
     specs},
    {"AdamW ZeRO-2", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS
                     ", \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 500}, \"gradient_clipping\": 1.0}",
     specs},
    {"OneBitAdam", "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}," GROUPS "}",
     specs},
    {"OneBitLamb", "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}," GROUPS "}",
     specs},
    {"ZeroOneAdam", "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.01, \"var_freeze_step\": 4,"
                    " \"var_update_scaler\": 1, \"local_step_scaler\": 1, \"local_step_clipper\": 2}}," GROUPS "}",
     specs},
};

static void runs_bit_identical_to_the_mpi_communicator(void) {
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
    const case_t *t = &cases[c];
    mpi_ops o;
    dsopt_comm *mpi = world_comm(), *custom = custom_comm(&o);
    model a, b;
    model_init(&a, t->specs, NUM_TENSORS, 1201);
    model_init(&b, t->specs, NUM_TENSORS, 1201);
    dsopt_optimizer *on_mpi = NULL, *on_custom = NULL;
    int ok = CHECK_OK(dsopt_create(&on_mpi, t->config, mpi, a.params, NUM_TENSORS));
    ok &= CHECK_OK(dsopt_create(&on_custom, t->config, custom, b.params, NUM_TENSORS));
    int compressed = 0;
    if (all_ranks(ok)) {
      for (int k = 1; k <= STEPS; ++k) {
        rng ra = rng_for(1202, (uint64_t)world_rank(), (uint64_t)k);
        rng rb = rng_for(1202, (uint64_t)world_rank(), (uint64_t)k);
        model_random_grads(&a, &ra, 1.0, 1.0);
        model_random_grads(&b, &rb, 1.0, 1.0);
        dsopt_step_info ia, ib;
        memset(&ia, 0, sizeof ia);
        memset(&ib, 0, sizeof ib);
        ia.struct_size = ib.struct_size = sizeof ia;
        CHECK_OK(dsopt_step(on_mpi, a.grads, NUM_TENSORS, &ia));
        CHECK_OK(dsopt_step(on_custom, b.grads, NUM_TENSORS, &ib));
        compressed |= ia.compressed;
        CHECKF(model_params_identical(&a, &b), "%s step %d: parameters bit-identical", t->name, k);
        CHECKF(ia.bytes_sent == ib.bytes_sent && ia.phase == ib.phase && ia.skipped == ib.skipped,
               "%s step %d: bytes_sent %llu/%llu, phase %d/%d", t->name, k, (unsigned long long)ia.bytes_sent,
               (unsigned long long)ib.bytes_sent, ia.phase, ib.phase);
      }
      uint64_t sa = 0, sb = 0;
      unsigned char *blob_a = state_blob(on_mpi, &sa), *blob_b = state_blob(on_custom, &sb);
      CHECKF(same_bytes(blob_a, sa, blob_b, sb), "%s: state blobs identical", t->name);
      free(blob_a);
      free(blob_b);
      if (strstr(t->name, "Bit") || strstr(t->name, "ZeroOne"))
        CHECKF(compressed, "%s: the compressed stage ran", t->name);
    }
    dsopt_destroy(on_mpi);
    dsopt_destroy(on_custom);
    model_free(&a);
    model_free(&b);
    dsopt_comm_destroy(custom);
    dsopt_comm_destroy(mpi);
    CHECKF(o.released, "%s: dsopt_comm_destroy called release", t->name);
    MPI_Comm_free(&o.comm);
  }
}

/* ---- a failing callback --------------------------------------------------- */

static void a_failing_callback_fails_every_rank(void) {
  const char *configs[] = {cases[0].config, cases[4].config};
  for (int c = 0; c < 2; ++c) {
    mpi_ops o;
    dsopt_comm *custom = custom_comm(&o);
    model m;
    model_init(&m, specs, NUM_TENSORS, 1203);
    dsopt_optimizer *opt = NULL;
    if (!all_ranks(CHECK_OK(dsopt_create(&opt, configs[c], custom, m.params, NUM_TENSORS)))) continue;
    /* the second collective of the fourth step (1-bit Adam: compressed) */
    rng r = rng_for(1204, (uint64_t)world_rank(), 1);
    model_random_grads(&m, &r, 1.0, 1.0);
    CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
    for (int k = 2; k <= 3; ++k) CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
    o.fail_at = o.calls + 2;
    o.fail_rank = world_size() - 1;
    int status = dsopt_step(opt, m.grads, NUM_TENSORS, NULL);
    CHECK_STATUS(status, DSOPT_ECOMM);
    const char *text = world_rank() == o.fail_rank ? "injected failure" : "failed";
    CHECKF(strstr(dsopt_last_error(), "custom communicator") && strstr(dsopt_last_error(), text),
           "config %d: the callback's text in dsopt_last_error: %s", c, dsopt_last_error());
    long calls = o.calls;
    status = dsopt_step(opt, m.grads, NUM_TENSORS, NULL);
    CHECK_STATUS(status, DSOPT_ECOMM);
    CHECKF(o.calls == calls, "config %d: a failed custom communicator is not called again", c);
    dsopt_destroy(opt);
    model_free(&m);
    dsopt_comm_destroy(custom);
    MPI_Comm_free(&o.comm);
  }
}

/* ---- bad tables ------------------------------------------------------------ */

static void bad_tables_are_rejected(void) {
  mpi_ops o;
  memset(&o, 0, sizeof o);
  dsopt_comm *c = (dsopt_comm *)&o; /* must stay as it is */
  dsopt_comm_ops ops = table();
  CHECK_STATUS(dsopt_comm_create_custom(NULL, &ops, &o), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_comm_create_custom(&c, NULL, &o), DSOPT_EINVAL);
  ops.struct_size = 8;
  CHECK_STATUS(dsopt_comm_create_custom(&c, &ops, &o), DSOPT_EINVAL);
  CHECK(check_contains_ignoring_case(dsopt_last_error(), "struct_size"));
  ops = table();
  ops.alltoall = NULL;
  CHECK_STATUS(dsopt_comm_create_custom(&c, &ops, &o), DSOPT_EINVAL);
  CHECK(check_contains_ignoring_case(dsopt_last_error(), "alltoall"));
  ops = table();
  ops.rank = ops.size;
  CHECK_STATUS(dsopt_comm_create_custom(&c, &ops, &o), DSOPT_EINVAL);
  CHECK(check_contains_ignoring_case(dsopt_last_error(), "rank"));
  ops = table();
  ops.size = 0;
  ops.rank = 0;
  CHECK_STATUS(dsopt_comm_create_custom(&c, &ops, &o), DSOPT_EINVAL);
  ops = table();
  ops.flags = 8;
  CHECK_STATUS(dsopt_comm_create_custom(&c, &ops, &o), DSOPT_EINVAL);
  CHECK(check_contains_ignoring_case(dsopt_last_error(), "flags"));
  CHECK(c == (dsopt_comm *)&o);
  CHECK(!o.released);
  ops = table();
  CHECK_OK(dsopt_comm_create_custom(&c, &ops, &o));
  CHECK_EQ_INT(dsopt_comm_rank(c), world_rank());
  CHECK_EQ_INT(dsopt_comm_size(c), world_size());
  dsopt_comm_destroy(c);
  CHECK(o.released);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(bad_tables_are_rejected);
  RUN_TEST(runs_bit_identical_to_the_mpi_communicator);
  RUN_TEST(a_failing_callback_fails_every_rank);
  int rc = check_finish();
  MPI_Finalize();
  return rc;
}
