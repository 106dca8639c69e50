/* dsopt.h must compile on its own, as the first and only include, included
 * twice, as C99 and as C++ (the build compiles this file with
 * -Wall -Wextra -pedantic -Werror in each language). */
#include "dsopt.h"
#include "dsopt.h"

/* Touch the types and a few declarations so a broken one cannot hide. */
int dsopt_header_alone_uses_declarations(void);
int dsopt_header_alone_uses_declarations(void) {
  dsopt_tensor tensor;
  dsopt_step_info info;
  int (*step)(dsopt_optimizer *, const dsopt_tensor *, int64_t, dsopt_step_info *) = dsopt_step;
  int (*create_nccl)(dsopt_comm **, struct ncclComm *, struct CUstream_st *) = dsopt_comm_create_nccl;
  tensor.numel = 1;
  tensor.dtype = DSOPT_FLOAT32;
  info.struct_size = (uint32_t)sizeof info;
  return (int)tensor.numel + (int)info.struct_size + (step != 0) + (create_nccl != 0) + DSOPT_OK +
         DSOPT_VERSION_MAJOR + (int)sizeof(size_t);
}
