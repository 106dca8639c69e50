/* Uses the experimental part of dsopt.h: compiles as it is, and must fail
 * to compile with -DDSOPT_STABLE_ONLY (the part is left out). */
#include "dsopt.h"

int dsopt_experimental_part_is_declared(void);
int dsopt_experimental_part_is_declared(void) {
  dsopt_comm_ops ops;
  dsopt_state_view view;
  dsopt_codec_options codec_options;
  int (*grad_ready)(dsopt_optimizer *, int64_t, const dsopt_tensor *) = dsopt_grad_ready;
  int (*get_config)(const dsopt_optimizer *, char *, uint64_t, uint64_t *) = dsopt_get_config;
  ops.struct_size = (uint32_t)sizeof ops;
  view.struct_size = (uint32_t)sizeof view;
  codec_options.struct_size = (uint32_t)sizeof codec_options;
  return (grad_ready != 0) + (get_config != 0) + (int)ops.struct_size + (int)view.struct_size +
         (int)codec_options.struct_size;
}
