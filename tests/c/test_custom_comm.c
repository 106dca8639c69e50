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
#include "support/failing_mpi_comm.h"
#include "support/mpi_world.h"

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
    dsopt_comm *mpi = world_comm(), *custom = custom_comm(&o, 0);
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
    dsopt_comm *custom = custom_comm(&o, 0);
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
