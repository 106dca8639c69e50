/*
 * The test harness of the C tests: every CHECK counts as passed or failed; a
 * failure prints file:line, what was checked and dsopt_last_error() of the
 * calling thread. check_finish() prints "N passed, N failed" as the program's
 * last line and returns the exit status (nonzero on any failure).
 *
 * Header-only with static state: each test program includes it from its one
 * source file. The macros evaluate to 1 (passed) or 0 (failed), so a test can
 * stop early with `if (!CHECK_OK(...)) return;` where going on makes no sense
 * (never in the middle of a collective sequence in the MPI tests).
 */
#ifndef DSOPT_TESTS_CHECK_H
#define DSOPT_TESTS_CHECK_H

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsopt.h"

static int check_passed_count;
static int check_failed_count;
/* Put in front of every failure line, e.g. "rank 1: " in the MPI tests. */
static char check_prefix[64];
static const char *check_current_test = "";

static inline int check_report(int ok, const char *file, int line, const char *fmt, ...) {
  if (ok) {
    ++check_passed_count;
    return 1;
  }
  ++check_failed_count;
  va_list args;
  va_start(args, fmt);
  printf("%sFAIL %s:%d [%s]: ", check_prefix, file, line, check_current_test);
  vprintf(fmt, args);
  va_end(args);
  printf("\n%s     last error: \"%s\"\n", check_prefix, dsopt_last_error());
  fflush(stdout);
  return 0;
}

static inline int check_eq_int(long long actual, long long expected, const char *file, int line,
                               const char *actual_text, const char *expected_text) {
  return check_report(actual == expected, file, line, "%s == %s: got %lld, expected %lld",
                      actual_text, expected_text, actual, expected);
}

static inline int check_status(int actual, int expected, const char *file, int line,
                               const char *call_text) {
  return check_report(actual == expected, file, line, "%s returned %d (%s), expected %d (%s)",
                      call_text, actual, dsopt_status_string(actual), expected,
                      dsopt_status_string(expected));
}

static inline int check_contains_ignoring_case(const char *text, const char *word) {
  size_t n = strlen(word);
  for (; *text; ++text) {
    size_t i = 0;
    while (i < n && text[i] &&
           tolower((unsigned char)text[i]) == tolower((unsigned char)word[i]))
      ++i;
    if (i == n) return 1;
  }
  return n == 0;
}

/* `words` is one keyword or several separated by '|'; the text must contain
 * one of them (ignoring case). */
static inline int check_mentions_any(const char *text, const char *words) {
  char buf[256];
  const char *start = words;
  for (;;) {
    const char *bar = strchr(start, '|');
    size_t len = bar ? (size_t)(bar - start) : strlen(start);
    if (len >= sizeof buf) len = sizeof buf - 1;
    memcpy(buf, start, len);
    buf[len] = '\0';
    if (check_contains_ignoring_case(text, buf)) return 1;
    if (!bar) return 0;
    start = bar + 1;
  }
}

static inline int check_error_mentions(const char *words, const char *file, int line) {
  return check_report(check_mentions_any(dsopt_last_error(), words), file, line,
                      "last error should mention \"%s\"", words);
}

static inline void check_run(const char *name, void (*test)(void)) {
  check_current_test = name;
  test();
  check_current_test = "";
}

static inline void check_skip(const char *what, const char *reason) {
  printf("%sSKIP %s: %s\n", check_prefix, what, reason);
  fflush(stdout);
}

static inline int check_finish(void) {
  printf("%s%d passed, %d failed\n", check_prefix, check_passed_count, check_failed_count);
  fflush(stdout);
  return check_failed_count == 0 ? 0 : 1;
}

#define CHECK(cond) check_report((cond) != 0, __FILE__, __LINE__, "%s", #cond)
/* CHECK with a printf-style description of what was expected. */
#define CHECKF(cond, ...) check_report((cond) != 0, __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_EQ_INT(actual, expected) \
  check_eq_int((long long)(actual), (long long)(expected), __FILE__, __LINE__, #actual, #expected)
#define CHECK_STATUS(call, expected) check_status((call), (expected), __FILE__, __LINE__, #call)
#define CHECK_OK(call) CHECK_STATUS((call), DSOPT_OK)
/* The last error of this thread contains the word (or one of "a|b|c"). */
#define CHECK_ERROR_MENTIONS(words) check_error_mentions((words), __FILE__, __LINE__)
#define RUN_TEST(fn) check_run(#fn, fn)

#endif /* DSOPT_TESTS_CHECK_H */
