/* dsopt_codec_*: compressed ZeRO's codes behind the C API (dsopt.h
 * "Codecs"). The record layout of each codec on values whose codes can be
 * worked out by hand, the residual of error feedback, the sum over runs in
 * run order, sizes, thread-count invariance, and every bad argument:
 * rejected with its status and a message, nothing written. (Random data
 * against the independent numpy reference: tests/python/test_codec.py.) */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

#define GUARD 0xA5

static dsopt_codec *make(const char *name, int64_t block) {
  dsopt_codec_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.block = block;
  o.threads = 1;
  dsopt_codec *c = NULL;
  return dsopt_codec_create(&c, name, &o) == DSOPT_OK ? c : NULL;
}

static float scale_of(const uint8_t *record) {
  float s;
  memcpy(&s, record, 4);
  return s;
}

static int all_bytes(const uint8_t *p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != v) return 0;
  return 1;
}

static void sizes_follow_the_records(void) {
  const char *names[] = {"int8", "int4", "sign", "bf16"};
  const uint64_t encoded[] = {2 * (4 + 64), 2 * (4 + 32), 2 * (4 + 8), 200};
  for (int k = 0; k < 4; ++k) {
    dsopt_codec *c = NULL;
    if (!CHECK_OK(dsopt_codec_create(&c, names[k], NULL))) continue;
    uint64_t bytes = 0;
    CHECK_OK(dsopt_codec_encoded_size(c, 100, &bytes));
    CHECKF(bytes == encoded[k], "%s: 100 values encode to %llu bytes", names[k], (unsigned long long)bytes);
    if (k < 3) {
      CHECK_OK(dsopt_codec_residual_size(c, 100, &bytes));
      CHECK_EQ_INT(bytes, 2 * (4 + 64));
    } else {
      CHECK_STATUS(dsopt_codec_residual_size(c, 100, &bytes), DSOPT_EUNSUPPORTED);
      CHECK_ERROR_MENTIONS("residual");
    }
    CHECK_STATUS(dsopt_codec_encoded_size(c, 0, &bytes), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_codec_encoded_size(c, 8, NULL), DSOPT_EINVAL);
    dsopt_codec_destroy(c);
  }
  dsopt_codec *c = make("int4", 256);
  uint64_t bytes = 0;
  if (CHECK(c != NULL)) CHECK_OK(dsopt_codec_encoded_size(c, 300, &bytes));
  CHECK_EQ_INT(bytes, 2 * (4 + 128));
  dsopt_codec_destroy(c);
}

/* int8, block 8: amax 127 gives s = 1, so the levels are rint(x), ties to
 * even; the residual is the int8 code of what was lost. */
static void int8_levels_and_residual(void) {
  dsopt_codec *c = make("int8", 8);
  if (!CHECK(c != NULL)) return;
  float x[8] = {127.0f, -63.5f, 0.5f, 1.5f, 2.5f, -3.0f, 10.25f, 0.0f};
  const int8_t levels[8] = {127, -64, 0, 2, 2, -3, 10, 0};
  uint8_t code[12], residual[12];
  memset(residual, 0, sizeof residual);
  dsopt_tensor v = {x, 8, DSOPT_FLOAT32, 0};
  CHECK_OK(dsopt_codec_encode(c, &v, 1, residual, sizeof residual, code, sizeof code));
  CHECK(scale_of(code) == 1.0f);
  CHECK(memcmp(code + 4, levels, 8) == 0);
  /* lost: 0, 0.5, 0.5, -0.5, 0.5, 0, 0.25, 0: scale fl(0.5 / 127) */
  const float se = 0.5f / 127.0f;
  CHECK(scale_of(residual) == se);
  const int8_t elevels[8] = {0, 127, 127, -127, 127, 0, (int8_t)rintf(0.25f / se), 0};
  CHECK(memcmp(residual + 4, elevels, 8) == 0);

  /* Decoded: q s; the residual decodes with the same codec. */
  float d[8];
  dsopt_tensor out = {d, 8, DSOPT_FLOAT32, 0};
  CHECK_OK(dsopt_codec_decode_sum(c, code, sizeof code, 1, &out));
  for (int i = 0; i < 8; ++i) CHECKF(d[i] == (float)levels[i], "element %d decodes to %g", i, d[i]);
  CHECK_OK(dsopt_codec_decode_sum(c, residual, sizeof residual, 1, &out));
  CHECK(d[1] == 127.0f * se && d[3] == -127.0f * se && d[0] == 0.0f);

  /* The next encoding reads x + e and keeps its new loss. */
  float g[8] = {0, 0, 0, 0, 0, 0, 0, 127.0f};
  dsopt_tensor gv = {g, 8, DSOPT_FLOAT32, 0};
  uint8_t code2[12];
  CHECK_OK(dsopt_codec_encode(c, &gv, 1, residual, sizeof residual, code2, sizeof code2));
  CHECK(scale_of(code2) == 1.0f); /* amax 127 (g[7]); e's values are below 1 */
  CHECK((int8_t)code2[4 + 1] == (int8_t)rintf(127.0f * se)); /* rint(0.5...) */
  dsopt_codec_destroy(c);
}

/* int4: s = amax / 7, two levels per byte, element 2k in the low nibble;
 * a short last block leaves the rest of its record zero. */
static void int4_nibbles(void) {
  dsopt_codec *c = make("int4", 8);
  if (!CHECK(c != NULL)) return;
  float x[11] = {7, -7, 1, -1, 3, 0, -2, 6, /* next block: */ 14, -3, 2};
  uint8_t code[2 * 8];
  memset(code, GUARD, sizeof code);
  dsopt_tensor v = {x, 11, DSOPT_FLOAT32, 0};
  CHECK_OK(dsopt_codec_encode(c, &v, 1, NULL, 0, code, sizeof code));
  CHECK(scale_of(code) == 1.0f);
  CHECK(code[4] == (uint8_t)((7 & 0xF) | ((-7 & 0xF) << 4)));
  CHECK(code[5] == (uint8_t)((1 & 0xF) | ((-1 & 0xF) << 4)));
  CHECK(code[7] == (uint8_t)((-2 & 0xF) | ((6 & 0xF) << 4)));
  CHECK(scale_of(code + 8) == 2.0f); /* 14 / 7 */
  /* -3 / 2 = -1.5 -> -2 (even), 2 / 2 = 1, then zero nibbles */
  CHECK(code[12] == (uint8_t)((7 & 0xF) | ((-2 & 0xF) << 4)));
  CHECK(code[13] == 1 && code[14] == 0 && code[15] == 0);
  float d[11];
  dsopt_tensor out = {d, 11, DSOPT_FLOAT32, 0};
  CHECK_OK(dsopt_codec_decode_sum(c, code, sizeof code, 1, &out));
  CHECK(d[0] == 7 && d[1] == -7 && d[8] == 14 && d[9] == -4 && d[10] == 2);
  dsopt_codec_destroy(c);
}

/* sign: s = mean |x| (in double), bit i%8 of byte i/8 set iff x < 0. */
static void sign_bits_and_mean(void) {
  dsopt_codec *c = make("sign", 8);
  if (!CHECK(c != NULL)) return;
  float x[8] = {1, -2, 3, -4, 0.5f, -0.0f, 0.25f, -1};
  uint8_t code[5];
  dsopt_tensor v = {x, 8, DSOPT_FLOAT32, 0};
  CHECK_OK(dsopt_codec_encode(c, &v, 1, NULL, 0, code, sizeof code));
  double sum = 0;
  for (int i = 0; i < 8; ++i) sum += fabs((double)x[i]);
  CHECK(scale_of(code) == (float)(sum / 8));
  CHECK(code[4] == (uint8_t)((1 << 1) | (1 << 3) | (1 << 7))); /* -0.0 is not < 0 */
  dsopt_codec_destroy(c);
}

/* bf16: round to nearest even, 2 bytes per element, no residual. */
static void bf16_rounds_to_nearest_even(void) {
  dsopt_codec *c = NULL;
  if (!CHECK_OK(dsopt_codec_create(&c, "bf16", NULL))) return;
  const uint32_t bits[3] = {0x3F808000u /* tie: to 0x3F80 */, 0x3F818000u /* tie: to 0x3F82 */,
                            0x3F808001u /* above the tie: 0x3F81 */};
  float x[3];
  memcpy(x, bits, sizeof x);
  uint16_t code[3];
  dsopt_tensor v = {x, 3, DSOPT_FLOAT32, 0};
  CHECK_OK(dsopt_codec_encode(c, &v, 1, NULL, 0, code, sizeof code));
  CHECK(code[0] == 0x3F80 && code[1] == 0x3F82 && code[2] == 0x3F81);
  uint8_t residual[64];
  CHECK_STATUS(dsopt_codec_encode(c, &v, 1, residual, sizeof residual, code, sizeof code), DSOPT_EUNSUPPORTED);
  dsopt_codec_destroy(c);
}

/* Runs are encoded on their own (blocks restart at each run), and the sum
 * over runs is taken in run order, one rounding per addition. */
static void runs_sum_in_order(void) {
  const char *names[] = {"int8", "int4", "sign", "bf16"};
  enum { RUNS = 3, N = 37 };
  float x[RUNS * N];
  uint32_t state = 12345u;
  for (int i = 0; i < RUNS * N; ++i) {
    state = state * 1664525u + 1013904223u;
    x[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * (float)(1 + i % 7) * 1e3f;
  }
  for (int k = 0; k < 4; ++k) {
    dsopt_codec *c = make(names[k], k < 3 ? 16 : 0);
    if (!CHECK(c != NULL)) continue;
    uint64_t run = 0;
    CHECK_OK(dsopt_codec_encoded_size(c, N, &run));
    uint8_t all[RUNS * 512], one[512];
    dsopt_tensor v = {x, RUNS * N, DSOPT_FLOAT32, 0};
    CHECK_OK(dsopt_codec_encode(c, &v, RUNS, NULL, 0, all, sizeof all));
    float expected[N], d[N];
    dsopt_tensor out = {d, N, DSOPT_FLOAT32, 0};
    for (int j = 0; j < RUNS; ++j) {
      dsopt_tensor vj = {x + j * N, N, DSOPT_FLOAT32, 0};
      CHECK_OK(dsopt_codec_encode(c, &vj, 1, NULL, 0, one, sizeof one));
      CHECKF(memcmp(one, all + j * run, run) == 0, "%s: run %d encoded alone", names[k], j);
      CHECK_OK(dsopt_codec_decode_sum(c, one, run, 1, &out));
      for (int i = 0; i < N; ++i) expected[i] = j == 0 ? d[i] : expected[i] + d[i];
    }
    CHECK_OK(dsopt_codec_decode_sum(c, all, RUNS * run, RUNS, &out));
    CHECKF(memcmp(d, expected, sizeof d) == 0, "%s: the sum of the runs in order", names[k]);
    dsopt_codec_destroy(c);
  }
}

/* The bytes do not depend on the thread count. */
static void threads_change_nothing(void) {
  enum { N = 40000 };
  static float x[N];
  static uint8_t a[N], b[N], ea[N + N / 8], eb[N + N / 8];
  for (int i = 0; i < N; ++i) x[i] = sinf((float)i * 0.37f) * (float)(1 + i % 13);
  dsopt_codec_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  dsopt_codec *one = NULL, *many = NULL;
  o.threads = 1;
  CHECK_OK(dsopt_codec_create(&one, "int4", &o));
  o.threads = 2;
  CHECK_OK(dsopt_codec_create(&many, "int4", &o));
  if (!one || !many) return;
  uint64_t rbytes = 0;
  CHECK_OK(dsopt_codec_residual_size(one, N / 4, &rbytes));
  memset(ea, 0, sizeof ea);
  memset(eb, 0, sizeof eb);
  dsopt_tensor v = {x, N, DSOPT_FLOAT32, 0};
  for (int step = 0; step < 2; ++step) {
    CHECK_OK(dsopt_codec_encode(one, &v, 4, ea, 4 * rbytes, a, sizeof a));
    CHECK_OK(dsopt_codec_encode(many, &v, 4, eb, 4 * rbytes, b, sizeof b));
  }
  CHECK(memcmp(a, b, sizeof a) == 0);
  CHECK(memcmp(ea, eb, 4 * rbytes) == 0);
  dsopt_codec_destroy(one);
  dsopt_codec_destroy(many);
}

static void create_rejects_bad_options(void) {
  dsopt_codec *c = (dsopt_codec *)&c; /* must stay as it is on failure */
  dsopt_codec *const before = c;
  dsopt_codec_options o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  CHECK_STATUS(dsopt_codec_create(&c, "int2", &o), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("int2");
  CHECK_STATUS(dsopt_codec_create(&c, NULL, &o), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_create(NULL, "int8", &o), DSOPT_EINVAL);
  const int64_t blocks[] = {4, 12, 65544, -8};
  for (int k = 0; k < 4; ++k) {
    o.block = blocks[k];
    CHECK_STATUS(dsopt_codec_create(&c, "int8", &o), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("block");
  }
  o.block = 64;
  CHECK_STATUS(dsopt_codec_create(&c, "bf16", &o), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("bf16");
  o.block = 0;
  o.device = 7;
  CHECK_STATUS(dsopt_codec_create(&c, "int8", &o), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("device");
  o.device = DSOPT_COMM_HOST;
  o.threads = -1;
  CHECK_STATUS(dsopt_codec_create(&c, "int8", &o), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("threads");
  o.threads = 0;
  o.reserved = 1;
  CHECK_STATUS(dsopt_codec_create(&c, "int8", &o), DSOPT_EINVAL);
  o.reserved = 0;
  o.struct_size = 4;
  CHECK_STATUS(dsopt_codec_create(&c, "int8", &o), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("struct_size");
  if (strstr(dsopt_build_info(), "cuda=off")) {
    o.struct_size = sizeof o;
    o.device = DSOPT_COMM_CUDA;
    CHECK_STATUS(dsopt_codec_create(&c, "int8", &o), DSOPT_EUNSUPPORTED);
    CHECK_ERROR_MENTIONS("CUDA");
  }
  CHECK(c == before);

  /* A caller built against a newer header: fields past this library's
   * struct are ignored. */
  struct {
    dsopt_codec_options o;
    unsigned char future[16];
  } newer;
  memset(&newer, GUARD, sizeof newer);
  memset(&newer.o, 0, sizeof newer.o);
  newer.o.struct_size = sizeof newer;
  newer.o.block = 32;
  if (CHECK_OK(dsopt_codec_create(&c, "int4", &newer.o))) {
    uint64_t bytes = 0;
    CHECK_OK(dsopt_codec_encoded_size(c, 32, &bytes));
    CHECK_EQ_INT(bytes, 4 + 16);
    CHECK_OK(dsopt_codec_set_stream(c, NULL)); /* unused on host */
    dsopt_codec_destroy(c);
  }
  dsopt_codec_destroy(NULL);
  CHECK_STATUS(dsopt_codec_set_stream(NULL, NULL), DSOPT_EINVAL);
}

/* Every bad argument: its status, a message, and neither dst nor the
 * residual touched. */
static void bad_arguments_change_nothing(void) {
  dsopt_codec *c = make("int4", 8);
  if (!CHECK(c != NULL)) return;
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = (float)(i - 7) * 0.3f;
  uint8_t dst[64], residual[24], codes[24];
  memset(dst, GUARD, sizeof dst);
  memset(residual, 0x11, sizeof residual); /* a residual of scale ~1e-28 */
  memset(codes, 0, sizeof codes);
  dsopt_tensor v = {x, 16, DSOPT_FLOAT32, 0};
  dsopt_tensor f16 = {x, 16, DSOPT_FLOAT16, 0};
  dsopt_tensor empty = {x, 0, DSOPT_FLOAT32, 0};
  dsopt_tensor null_data = {NULL, 16, DSOPT_FLOAT32, 0};
#define UNTOUCHED() CHECK(all_bytes(dst, sizeof dst, GUARD) && all_bytes(residual, sizeof residual, 0x11))
  CHECK_STATUS(dsopt_codec_encode(NULL, &v, 2, residual, 24, dst, 64), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_encode(c, NULL, 2, residual, 24, dst, 64), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_encode(c, &null_data, 2, residual, 24, dst, 64), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_encode(c, &empty, 1, residual, 24, dst, 64), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_encode(c, &f16, 2, residual, 24, dst, 64), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("fp32");
  CHECK_STATUS(dsopt_codec_encode(c, &v, 0, residual, 24, dst, 64), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("runs");
  CHECK_STATUS(dsopt_codec_encode(c, &v, 3, residual, 24, dst, 64), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("multiple");
  CHECK_STATUS(dsopt_codec_encode(c, &v, 2, residual, 23, dst, 64), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("residual_size");
  CHECK_STATUS(dsopt_codec_encode(c, &v, 2, residual, 24, NULL, 64), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_encode(c, &v, 2, residual, 24, dst, 15), DSOPT_EBUFS);
  CHECK_ERROR_MENTIONS("16");
  CHECK_STATUS(dsopt_codec_encode(c, &v, 2, residual, 24, residual + 4, 16), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("overlap");
  CHECK_STATUS(dsopt_codec_encode(c, &v, 2, residual, 24, (uint8_t *)x + 8, 16), DSOPT_EINVAL);
  UNTOUCHED();
  CHECK_OK(dsopt_codec_encode(c, &v, 2, residual, 24, dst, 64));
  CHECK(all_bytes(dst + 16, sizeof dst - 16, GUARD)); /* only the codes are written */

  float out_data[8];
  memset(out_data, GUARD, sizeof out_data);
  dsopt_tensor out = {out_data, 8, DSOPT_FLOAT32, 0};
  dsopt_tensor out16 = {out_data, 8, DSOPT_FLOAT16, 0};
  CHECK_STATUS(dsopt_codec_decode_sum(c, codes, 16, 3, &out), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("bytes");
  CHECK_STATUS(dsopt_codec_decode_sum(c, codes, 24, 0, &out), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_decode_sum(c, NULL, 24, 1, &out), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_decode_sum(c, codes, 24, 1, NULL), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_decode_sum(c, codes, 24, 1, &out16), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_codec_decode_sum(c, out_data, 24, 1, &out), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("overlap");
  CHECK(all_bytes((const uint8_t *)out_data, sizeof out_data, GUARD));
  CHECK_OK(dsopt_codec_decode_sum(c, codes, 24, 1, &out));
  CHECK(out_data[0] == 0.0f); /* all-zero codes: the zero values */
#undef UNTOUCHED
  dsopt_codec_destroy(c);
}

int main(void) {
  RUN_TEST(sizes_follow_the_records);
  RUN_TEST(int8_levels_and_residual);
  RUN_TEST(int4_nibbles);
  RUN_TEST(sign_bits_and_mean);
  RUN_TEST(bf16_rounds_to_nearest_even);
  RUN_TEST(runs_sum_in_order);
  RUN_TEST(threads_change_nothing);
  RUN_TEST(create_rejects_bad_options);
  RUN_TEST(bad_arguments_change_nothing);
  return check_finish();
}
