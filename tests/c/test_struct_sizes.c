/* The rule of every versioned struct (dsopt.h's top comment): dsopt reads or
 * writes only min(struct_size, sizeof) bytes. Each struct is passed as a
 * caller built against an older header would (a copy without its last
 * fields), as one built against a newer header would (a larger
 * struct_size), and below its smallest layout (DSOPT_EINVAL). Output
 * structs sit in front of guard bytes that must stay untouched; an input
 * struct's tail takes the defaults even where the caller's memory past
 * struct_size holds something else. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define N 8
#define GUARD 0xA5

static int guard_intact(const unsigned char *g, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (g[i] != GUARD) return 0;
  return 1;
}

/* ---- a one-rank custom communicator: every collective is a copy ---------- */

static size_t elem_bytes(int32_t elem) {
  return elem == DSOPT_COMM_FLOAT64 || elem == DSOPT_COMM_INT64 ? 8 : elem == DSOPT_COMM_UINT8 ? 1 : 4;
}
static int copy_elems(const void *send, void *recv, size_t count, int32_t elem, void *user) {
  (void)user;
  if (send != recv) memmove(recv, send, count * elem_bytes(elem));
  return 0;
}
static int reduce(const void *s, void *r, size_t n, int32_t elem, int32_t op, int32_t dev, void *u) {
  (void)op, (void)dev;
  return copy_elems(s, r, n, elem, u);
}
static int gather(const void *s, void *r, size_t n, int32_t elem, int32_t dev, void *u) {
  (void)dev;
  return copy_elems(s, r, n, elem, u);
}
static int releases;
static void count_release(void *user) {
  (void)user;
  ++releases;
}
static const char *message(int code, void *user) {
  (void)code, (void)user;
  return "";
}

static dsopt_comm_ops one_rank_ops(void) {
  dsopt_comm_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  ops.size = 1;
  ops.allreduce = reduce;
  ops.reduce_scatter = reduce;
  ops.allgather = gather;
  ops.alltoall = gather;
  ops.error_message = message;
  ops.release = count_release;
  return ops;
}

/* One AdamW step on the communicator, to show it works. */
static void steps_on(dsopt_comm *comm) {
  float p[N], g[N];
  for (int i = 0; i < N; ++i) p[i] = 1.0f, g[i] = 0.5f;
  dsopt_tensor param = {p, N, DSOPT_FLOAT32, 0}, grad = {g, N, DSOPT_FLOAT32, 0};
  dsopt_optimizer *opt = NULL;
  if (!CHECK_OK(dsopt_create(&opt, "{\"optimizer\": {\"type\": \"AdamW\"}}", comm, &param, 1))) return;
  CHECK_OK(dsopt_step(opt, &grad, 1, NULL));
  CHECK(p[0] < 1.0f);
  dsopt_destroy(opt);
}

/* dsopt_comm_ops without its optional callbacks (error_message, release):
 * they are NULL, whatever the caller's memory past struct_size holds. */
static void comm_ops_without_optional_tail(void) {
  dsopt_comm_ops ops = one_rank_ops(); /* release set, but past struct_size */
  ops.struct_size = (uint32_t)offsetof(dsopt_comm_ops, error_message);
  dsopt_comm *comm = NULL;
  releases = 0;
  if (!CHECK_OK(dsopt_comm_create_custom(&comm, &ops, NULL))) return;
  steps_on(comm);
  dsopt_comm_destroy(comm);
  CHECK_EQ_INT(releases, 0);
}

static void comm_ops_below_required_callbacks(void) {
  dsopt_comm_ops ops = one_rank_ops();
  ops.struct_size = (uint32_t)offsetof(dsopt_comm_ops, error_message) - 1;
  dsopt_comm *comm = NULL;
  CHECK_STATUS(dsopt_comm_create_custom(&comm, &ops, NULL), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("struct_size");
  CHECK(comm == NULL);
}

/* A newer caller: the struct plus fields this library does not know. */
static void comm_ops_of_a_newer_header(void) {
  struct {
    dsopt_comm_ops ops;
    void (*future_callback)(void);
  } newer;
  memset(&newer, 0, sizeof newer);
  newer.ops = one_rank_ops();
  newer.ops.struct_size = sizeof newer;
  dsopt_comm *comm = NULL;
  releases = 0;
  if (!CHECK_OK(dsopt_comm_create_custom(&comm, &newer.ops, NULL))) return;
  steps_on(comm);
  dsopt_comm_destroy(comm);
  CHECK_EQ_INT(releases, 1);
}

/* ---- output structs --------------------------------------------------------- */

typedef struct {
  dsopt_optimizer *opt;
  dsopt_comm *comm;
  float p[N], g[N];
  dsopt_tensor grad;
} one_param;

static int make_one_param(one_param *t) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < N; ++i) t->p[i] = 1.0f, t->g[i] = 0.25f;
  dsopt_tensor param = {t->p, N, DSOPT_FLOAT32, 0};
  t->grad = (dsopt_tensor){t->g, N, DSOPT_FLOAT32, 0};
  if (!CHECK_OK(dsopt_comm_create_local(&t->comm))) return 0;
  return CHECK_OK(dsopt_create(&t->opt, "{\"optimizer\": {\"type\": \"AdamW\"}}", t->comm, &param, 1));
}
static void free_one_param(one_param *t) {
  dsopt_destroy(t->opt);
  dsopt_comm_destroy(t->comm);
}

/* dsopt_step_info as the first header had it: up to consecutive_skips. */
typedef struct {
  uint32_t struct_size;
  int32_t skipped, compressed, reserved;
  int64_t step;
  double loss_scale, grad_norm;
  uint64_t bytes_sent;
  int64_t consecutive_skips;
} step_info_before_phase;

static void step_info_older_layout(void) {
  one_param t;
  if (!make_one_param(&t)) return;
  struct {
    step_info_before_phase info;
    unsigned char guard[64];
  } old;
  memset(&old, GUARD, sizeof old);
  old.info.struct_size = sizeof old.info;
  CHECK_OK(dsopt_step(t.opt, &t.grad, 1, (dsopt_step_info *)(void *)&old.info));
  CHECK_EQ_INT(old.info.step, 1);
  CHECK_EQ_INT(old.info.skipped, 0);
  CHECK_EQ_INT(old.info.consecutive_skips, 0);
  CHECK(old.info.loss_scale == 1.0);
  CHECK(guard_intact(old.guard, sizeof old.guard));
  CHECK_EQ_INT(old.info.struct_size, sizeof old.info);
  free_one_param(&t);
}

static void step_info_newer_and_too_small(void) {
  one_param t;
  if (!make_one_param(&t)) return;
  struct {
    dsopt_step_info info;
    unsigned char future[32];
  } newer;
  memset(&newer, GUARD, sizeof newer);
  newer.info.struct_size = sizeof newer;
  CHECK_OK(dsopt_step(t.opt, &t.grad, 1, &newer.info));
  CHECK_EQ_INT(newer.info.step, 1);
  CHECK_EQ_INT(newer.info.phase, DSOPT_PHASE_FULL);
  CHECK_EQ_INT(newer.info.diverging, 0);
  CHECK(guard_intact(newer.future, sizeof newer.future));

  dsopt_step_info none;
  memset(&none, GUARD, sizeof none);
  none.struct_size = 0;
  const float before = t.p[0];
  CHECK_STATUS(dsopt_step(t.opt, &t.grad, 1, &none), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("struct_size");
  CHECK(t.p[0] == before);
  free_one_param(&t);
}

/* dsopt_state_view without offset and param_numel. */
typedef struct {
  uint32_t struct_size;
  int32_t device;
  dsopt_tensor tensor;
} state_view_without_offsets;

static void state_view_older_newer_and_too_small(void) {
  one_param t;
  if (!make_one_param(&t)) return;
  CHECK_OK(dsopt_step(t.opt, &t.grad, 1, NULL));
  struct {
    state_view_without_offsets view;
    unsigned char guard[64];
  } old;
  memset(&old, GUARD, sizeof old);
  old.view.struct_size = sizeof old.view;
  CHECK_OK(dsopt_get_state_view(t.opt, 0, "exp_avg", (dsopt_state_view *)(void *)&old.view));
  CHECK_EQ_INT(old.view.device, DSOPT_COMM_HOST);
  CHECK_EQ_INT(old.view.tensor.numel, N);
  CHECK(old.view.tensor.data != NULL);
  CHECK(guard_intact(old.guard, sizeof old.guard));

  struct {
    dsopt_state_view view;
    unsigned char future[32];
  } newer;
  memset(&newer, GUARD, sizeof newer);
  newer.view.struct_size = sizeof newer;
  CHECK_OK(dsopt_get_state_view(t.opt, 0, "exp_avg", &newer.view));
  CHECK_EQ_INT(newer.view.param_numel, N);
  CHECK_EQ_INT(newer.view.offset, 0);
  CHECK(newer.view.tensor.data == old.view.tensor.data);
  CHECK(guard_intact(newer.future, sizeof newer.future));

  dsopt_state_view small;
  memset(&small, GUARD, sizeof small);
  small.struct_size = 3;
  CHECK_STATUS(dsopt_get_state_view(t.opt, 0, "exp_avg", &small), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("struct_size");
  CHECK(guard_intact((const unsigned char *)&small + sizeof small.struct_size,
                     sizeof small - sizeof small.struct_size));
  free_one_param(&t);
}

int main(void) {
  RUN_TEST(comm_ops_without_optional_tail);
  RUN_TEST(comm_ops_below_required_callbacks);
  RUN_TEST(comm_ops_of_a_newer_header);
  RUN_TEST(step_info_older_layout);
  RUN_TEST(step_info_newer_and_too_small);
  RUN_TEST(state_view_older_newer_and_too_small);
  return check_finish();
}
