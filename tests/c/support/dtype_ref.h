/* Reference conversions between fp32 and the 16-bit formats, written
 * independently of the library (by rounding in double arithmetic, not by bit
 * tricks), and element access to a buffer of any dsopt dtype. */
#ifndef DSOPT_TESTS_DTYPE_REF_H
#define DSOPT_TESTS_DTYPE_REF_H

#include <stddef.h>
#include <stdint.h>

size_t dtype_bytes(int32_t dtype);
const char *dtype_label(int32_t dtype);

float half_bits_to_float(uint16_t bits);
uint16_t float_to_half_bits(float value); /* round to nearest, ties to even */
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value); /* round to nearest, ties to even */

/* The value a float takes once stored in `dtype` (exact for fp32). */
float round_to_dtype(float value, int32_t dtype);

double element_get(const void *data, int32_t dtype, int64_t index);
/* Stores `value` rounded to nearest even in `dtype`. */
void element_set(void *data, int32_t dtype, int64_t index, float value);
uint16_t element_bits16(const void *data, int64_t index);

/* Distance in units in the last place between two 16-bit values of the
 * same format (both finite). */
int ulp_distance16(uint16_t a, uint16_t b);

#endif /* DSOPT_TESTS_DTYPE_REF_H */
