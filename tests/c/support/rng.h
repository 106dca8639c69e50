/* A fixed-seed PRNG (xorshift64*) so every run of a test sees the same data
 * and every rank can regenerate every other rank's data. */
#ifndef DSOPT_TESTS_RNG_H
#define DSOPT_TESTS_RNG_H

#include <stdint.h>

typedef struct rng {
  uint64_t state;
} rng;

/* Distinct seeds give unrelated streams (the seed is mixed first). */
static inline rng rng_seeded(uint64_t seed) {
  rng r;
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  r.state = (z ^ (z >> 31)) | 1u;
  return r;
}

/* A stream for (what, rank, step): tests derive all data from this. */
static inline rng rng_for(uint64_t what, uint64_t rank, uint64_t step) {
  return rng_seeded(what * 1000003ull * 1000003ull + rank * 1000003ull + step);
}

static inline uint64_t rng_next(rng *r) {
  uint64_t x = r->state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [0, 1). */
static inline double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Uniform in [-scale, -scale/64] or [scale/64, scale]: random signs and
 * magnitudes, never zero or tiny, so every element takes part. */
static inline double rng_signed(rng *r, double scale) {
  double magnitude = scale * (1.0 / 64.0 + (63.0 / 64.0) * rng_unit(r));
  return (rng_next(r) & 1u) ? -magnitude : magnitude;
}

#endif /* DSOPT_TESTS_RNG_H */
