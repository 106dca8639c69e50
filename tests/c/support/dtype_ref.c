#include "dtype_ref.h"

#include <math.h>
#include <string.h>

#include "dsopt.h"

size_t dtype_bytes(int32_t dtype) { return dtype == DSOPT_FLOAT32 ? 4 : 2; }

const char *dtype_label(int32_t dtype) {
  switch (dtype) {
    case DSOPT_FLOAT32: return "fp32";
    case DSOPT_FLOAT16: return "fp16";
    case DSOPT_BFLOAT16: return "bf16";
    default: return "?";
  }
}

/* |x| rounded to `frac_bits` fraction bits, with exponents below `min_exp`
 * treated as subnormal (fixed quantum 2^(min_exp - frac_bits)). The quotient
 * by a power of two is exact in double; nearbyint rounds ties to even. */
static double round_magnitude(double x, int frac_bits, int min_exp) {
  int e;
  if (x == 0.0) return 0.0;
  frexp(x, &e);
  int exponent = e - 1;
  if (exponent < min_exp) exponent = min_exp;
  double quantum = ldexp(1.0, exponent - frac_bits);
  return nearbyint(x / quantum) * quantum;
}

/* Encodes a magnitude that is exactly representable in the format. */
static uint16_t encode_magnitude(double r, int frac_bits, int min_exp, int bias) {
  if (r < ldexp(1.0, min_exp)) return (uint16_t)(r / ldexp(1.0, min_exp - frac_bits));
  int exponent = ilogb(r);
  double fraction = (r / ldexp(1.0, exponent) - 1.0) * ldexp(1.0, frac_bits);
  return (uint16_t)(((exponent + bias) << frac_bits) | (int)fraction);
}

static uint16_t float_to_16(float value, int frac_bits, int min_exp, int bias, double max_finite,
                            uint16_t inf_bits, uint16_t nan_bits) {
  uint16_t sign = signbit(value) ? 0x8000u : 0u;
  if (isnan(value)) return (uint16_t)(sign | nan_bits);
  double r = round_magnitude(fabs((double)value), frac_bits, min_exp);
  if (r > max_finite) return (uint16_t)(sign | inf_bits);
  return (uint16_t)(sign | encode_magnitude(r, frac_bits, min_exp, bias));
}

static float bits16_to_float(uint16_t bits, int frac_bits, int exp_bits, int bias) {
  int exp_field = (bits & 0x7FFF) >> frac_bits;
  int fraction = bits & ((1 << frac_bits) - 1);
  double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  if (exp_field == (1 << exp_bits) - 1) return fraction ? NAN : (float)(sign * INFINITY);
  if (exp_field == 0) return (float)(sign * ldexp((double)fraction, 1 - bias - frac_bits));
  return (float)(sign * ldexp(1.0 + ldexp((double)fraction, -frac_bits), exp_field - bias));
}

float half_bits_to_float(uint16_t bits) { return bits16_to_float(bits, 10, 5, 15); }

uint16_t float_to_half_bits(float value) {
  return float_to_16(value, 10, -14, 15, 65504.0, 0x7C00u, 0x7E00u);
}

float bf16_bits_to_float(uint16_t bits) { return bits16_to_float(bits, 7, 8, 127); }

uint16_t float_to_bf16_bits(float value) {
  return float_to_16(value, 7, -126, 127, ldexp(2.0 - ldexp(1.0, -7), 127), 0x7F80u, 0x7FC0u);
}

float round_to_dtype(float value, int32_t dtype) {
  switch (dtype) {
    case DSOPT_FLOAT16: return half_bits_to_float(float_to_half_bits(value));
    case DSOPT_BFLOAT16: return bf16_bits_to_float(float_to_bf16_bits(value));
    default: return value;
  }
}

double element_get(const void *data, int32_t dtype, int64_t index) {
  switch (dtype) {
    case DSOPT_FLOAT16: return half_bits_to_float(((const uint16_t *)data)[index]);
    case DSOPT_BFLOAT16: return bf16_bits_to_float(((const uint16_t *)data)[index]);
    default: return ((const float *)data)[index];
  }
}

void element_set(void *data, int32_t dtype, int64_t index, float value) {
  switch (dtype) {
    case DSOPT_FLOAT16: ((uint16_t *)data)[index] = float_to_half_bits(value); break;
    case DSOPT_BFLOAT16: ((uint16_t *)data)[index] = float_to_bf16_bits(value); break;
    default: ((float *)data)[index] = value; break;
  }
}

uint16_t element_bits16(const void *data, int64_t index) { return ((const uint16_t *)data)[index]; }

/* Sign-magnitude bits mapped to integers that increase with the value. */
static int ordered16(uint16_t bits) { return (bits & 0x8000u) ? -(int)(bits & 0x7FFFu) : (int)bits; }

int ulp_distance16(uint16_t a, uint16_t b) {
  int d = ordered16(a) - ordered16(b);
  return d < 0 ? -d : d;
}
