/* Status strings, the per-thread last error, versions, build info,
 * communicator basics and the step-info size rule. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "check.h"
#include "support/model.h"

static const int all_status_codes[] = {DSOPT_OK,        DSOPT_EINVAL, DSOPT_EUNSUPPORTED, DSOPT_ENOMEM,
                                       DSOPT_EBUFS,     DSOPT_ECORRUPT, DSOPT_EMISMATCH, DSOPT_ECOMM,
                                       DSOPT_ECUDA,     DSOPT_EINTERNAL, DSOPT_ENONFINITE};
#define NUM_STATUS_CODES ((int)(sizeof all_status_codes / sizeof all_status_codes[0]))

static void every_status_has_a_distinct_fixed_string(void) {
  for (int i = 0; i < NUM_STATUS_CODES; ++i) {
    const char *text = dsopt_status_string(all_status_codes[i]);
    if (!CHECKF(text != NULL, "status %d has a string", all_status_codes[i])) continue;
    CHECKF(text[0] != '\0', "status %d has a non-empty string", all_status_codes[i]);
    CHECKF(strcmp(text, "unknown status") != 0, "status %d is not \"unknown status\"", all_status_codes[i]);
    CHECKF(text == dsopt_status_string(all_status_codes[i]), "status %d string is static", all_status_codes[i]);
    for (int j = 0; j < i; ++j)
      CHECKF(strcmp(text, dsopt_status_string(all_status_codes[j])) != 0, "strings of %d and %d differ",
             all_status_codes[i], all_status_codes[j]);
  }
}

static void unknown_status_gives_fixed_text(void) {
  const int unknown[] = {1, 2, -11, -12, 12345, -99999, 2147483647, -2147483647 - 1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
    const char *text = dsopt_status_string(unknown[i]);
    CHECKF(text != NULL && strcmp(text, "unknown status") == 0, "status %d gives \"unknown status\", got \"%s\"",
           unknown[i], text ? text : "(null)");
  }
}

static void last_error_is_never_null(void) {
  CHECK(dsopt_last_error() != NULL);
  CHECK_STATUS(dsopt_set_lr(NULL, 1.0), DSOPT_EINVAL);
  CHECK(dsopt_last_error() != NULL && dsopt_last_error()[0] != '\0');
}

/* What a second thread saw, for the main thread to check. */
typedef struct thread_result {
  char initial[256];
  char after_failure[256];
  int status;
  int never_null;
} thread_result;

static void copy_text(char *dst, size_t size, const char *src) {
  snprintf(dst, size, "%s", src ? src : "(null)");
}

static void *fail_on_another_thread(void *arg) {
  thread_result *result = (thread_result *)arg;
  const char *initial = dsopt_last_error();
  result->never_null = initial != NULL;
  copy_text(result->initial, sizeof result->initial, initial);
  /* A different failure from the main thread's (a null output pointer). */
  result->status = dsopt_comm_create_local(NULL);
  copy_text(result->after_failure, sizeof result->after_failure, dsopt_last_error());
  return NULL;
}

static void last_error_is_per_thread(void) {
  char main_text[256];
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  tensor_spec spec = {5, DSOPT_FLOAT32, DSOPT_FLOAT32, 0};
  model m;
  model_init(&m, &spec, 1, 11);
  CHECK_OK(dsopt_comm_create_local(&comm));
  CHECK_OK(dsopt_create(&opt, "{\"optimizer\": {\"type\": \"AdamW\"}}", comm, m.params, 1));
  CHECK_STATUS(dsopt_set_lr(opt, -1.0), DSOPT_EINVAL);
  copy_text(main_text, sizeof main_text, dsopt_last_error());
  CHECK(main_text[0] != '\0');

  pthread_t thread;
  thread_result result;
  memset(&result, 0, sizeof result);
  CHECK(pthread_create(&thread, NULL, fail_on_another_thread, &result) == 0);
  pthread_join(thread, NULL);

  CHECK(result.never_null);
  CHECKF(result.initial[0] == '\0', "a new thread starts with \"\", got \"%s\"", result.initial);
  CHECK_EQ_INT(result.status, DSOPT_EINVAL);
  CHECK(result.after_failure[0] != '\0');
  CHECKF(strcmp(result.after_failure, main_text) != 0, "the two threads' failures have different texts");
  CHECKF(strcmp(dsopt_last_error(), main_text) == 0,
         "main thread's error unaffected by the other thread: was \"%s\", now \"%s\"", main_text,
         dsopt_last_error());
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

static void version_number_matches_header_macros(void) {
  CHECK_EQ_INT(dsopt_version_number(),
               DSOPT_VERSION_MAJOR * 10000 + DSOPT_VERSION_MINOR * 100 + DSOPT_VERSION_PATCH);
}

static void build_info_names_the_simd_kernel(void) {
  const char *info = dsopt_build_info();
  if (!CHECK(info != NULL)) return;
  CHECKF(strstr(info, "simd=") != NULL, "build info \"%s\" contains simd=", info);
  CHECKF(strstr(info, "cuda=") != NULL, "build info \"%s\" contains cuda=", info);
  CHECK(info == dsopt_build_info());
  printf("build info: %s\n", info);
}

static void local_comm_is_a_world_of_one(void) {
  dsopt_comm *comm = NULL;
  if (!CHECK_OK(dsopt_comm_create_local(&comm))) return;
  CHECK(comm != NULL);
  CHECK_EQ_INT(dsopt_comm_rank(comm), 0);
  CHECK_EQ_INT(dsopt_comm_size(comm), 1);
  dsopt_comm_destroy(comm);
}

static void null_comm_has_rank_and_size_minus_one(void) {
  CHECK_EQ_INT(dsopt_comm_rank(NULL), -1);
  CHECK_EQ_INT(dsopt_comm_size(NULL), -1);
}

static void destroy_accepts_null(void) {
  dsopt_destroy(NULL);
  dsopt_comm_destroy(NULL);
  CHECK(1);
}

/* info.struct_size smaller than the struct: the fields past it keep what the
 * caller put there. */
static void step_info_fields_past_struct_size_are_not_written(void) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  tensor_spec spec = {9, DSOPT_FLOAT32, DSOPT_FLOAT32, 0};
  model m;
  model_init(&m, &spec, 1, 12);
  CHECK_OK(dsopt_comm_create_local(&comm));
  if (!CHECK_OK(dsopt_create(&opt, "{\"optimizer\": {\"type\": \"AdamW\"}}", comm, m.params, 1))) return;

  dsopt_step_info info;
  memset(&info, 0xAB, sizeof info);
  info.struct_size = (uint32_t)offsetof(dsopt_step_info, loss_scale);
  CHECK_OK(dsopt_step(opt, m.grads, 1, &info));
  CHECK_EQ_INT(info.skipped, 0);
  CHECK_EQ_INT(info.step, 1);
  unsigned char untouched[sizeof info];
  memset(untouched, 0xAB, sizeof untouched);
  size_t tail = offsetof(dsopt_step_info, loss_scale);
  CHECK(memcmp((unsigned char *)&info + tail, untouched + tail, sizeof info - tail) == 0);

  CHECK_OK(dsopt_step(opt, m.grads, 1, NULL));
  info.struct_size = sizeof info;
  CHECK_OK(dsopt_step(opt, m.grads, 1, &info));
  CHECK_EQ_INT(info.step, 3);
  CHECK_EQ_INT(info.compressed, 0);
  CHECK(info.loss_scale == 1.0);
  CHECK(info.grad_norm == -1.0);
  CHECK(info.bytes_sent == 0);
  CHECK_EQ_INT(info.phase, DSOPT_PHASE_FULL);
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

/* A caller built against the header before `phase` existed passes the old
 * size (up to consecutive_skips): every old field is written, the memory
 * after it is left alone. */
typedef struct step_info_before_phase {
  uint32_t struct_size;
  int32_t skipped, compressed, reserved;
  int64_t step;
  double loss_scale, grad_norm;
  uint64_t bytes_sent;
  int64_t consecutive_skips;
} step_info_before_phase;

static void step_info_of_an_older_caller_keeps_working(void) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  tensor_spec spec = {9, DSOPT_FLOAT32, DSOPT_FLOAT32, 0};
  model m;
  model_init(&m, &spec, 1, 12);
  CHECK_OK(dsopt_comm_create_local(&comm));
  if (!CHECK_OK(dsopt_create(&opt, "{\"optimizer\": {\"type\": \"ZeroOneAdam\"}}", comm, m.params, 1)))
    return;
  CHECK_EQ_INT(sizeof(step_info_before_phase), offsetof(dsopt_step_info, phase));
  struct {
    step_info_before_phase info;
    unsigned char after[16];
  } old;
  memset(&old, 0xAB, sizeof old);
  old.info.struct_size = sizeof old.info;
  CHECK_OK(dsopt_step(opt, m.grads, 1, (dsopt_step_info *)&old.info));
  CHECK_EQ_INT(old.info.step, 1);
  CHECK_EQ_INT(old.info.consecutive_skips, 0);
  unsigned char untouched[16];
  memset(untouched, 0xAB, sizeof untouched);
  CHECK(memcmp(old.after, untouched, sizeof untouched) == 0);
  dsopt_step_info info;
  memset(&info, 0xAB, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(dsopt_step(opt, m.grads, 1, &info));
  CHECK_EQ_INT(info.phase, DSOPT_PHASE_FULL);
  CHECK_EQ_INT(info.reserved2, 0);
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

int main(void) {
  RUN_TEST(every_status_has_a_distinct_fixed_string);
  RUN_TEST(step_info_of_an_older_caller_keeps_working);
  RUN_TEST(unknown_status_gives_fixed_text);
  RUN_TEST(last_error_is_never_null);
  RUN_TEST(last_error_is_per_thread);
  RUN_TEST(version_number_matches_header_macros);
  RUN_TEST(build_info_names_the_simd_kernel);
  RUN_TEST(local_comm_is_a_world_of_one);
  RUN_TEST(null_comm_has_rank_and_size_minus_one);
  RUN_TEST(destroy_accepts_null);
  RUN_TEST(step_info_fields_past_struct_size_are_not_written);
  return check_finish();
}
